package envelope

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// randomEnvelope returns a valid envelope, often with boundary values.
func randomEnvelope(r *rand.Rand) Envelope {
	pick := func(edges []int64, max int64) int64 {
		if r.IntN(4) == 0 {
			return edges[r.IntN(len(edges))]
		}
		return r.Int64N(max)
	}
	e := Envelope{
		Flags: Flags(r.IntN(2)),
		Soft:  pick([]int64{0, 1, 1 << 43, MaxExpiry - 1, MaxExpiry}, MaxExpiry+1),
		Delta: time.Duration(pick([]int64{0, 1, math.MaxInt64}, math.MaxInt64)),
		Fence: uint64(pick([]int64{0, 1, MaxFence}, MaxFence+1)),
	}
	if room := MaxExpiry - e.Soft; room > 0 {
		e.Hard = e.Soft + pick([]int64{0, 1, room}, room)
	} else {
		e.Hard = e.Soft
	}
	if n := r.IntN(3); n > 0 {
		e.Value = make([]byte, r.IntN(64*n))
		for i := range e.Value {
			e.Value[i] = byte(r.Uint32())
		}
	}
	return e
}

func equal(a, b Envelope) bool {
	return a.Flags == b.Flags && a.Soft == b.Soft && a.Hard == b.Hard && a.Delta == b.Delta &&
		a.Fence == b.Fence && bytes.Equal(a.Value, b.Value)
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		e := randomEnvelope(r)
		if err := e.Validate(); err != nil {
			t.Fatalf("generated %+v: %v", e, err)
		}
		prefix := []byte("prefix")
		b := Append(prefix, &e)
		if string(b[:len(prefix)]) != "prefix" {
			t.Fatalf("Append changed dst's contents: %q", b[:len(prefix)])
		}
		b = b[len(prefix):]
		if len(b) != HeaderSize+len(e.Value) {
			t.Fatalf("Append wrote %d bytes, want %d", len(b), HeaderSize+len(e.Value))
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Append(%+v)): %v", e, err)
		}
		if !equal(got, e) {
			t.Fatalf("Decode(Append(%+v)) = %+v", e, got)
		}
	}
}

// TestLayout pins the byte layout that Lua scripts depend on.
func TestLayout(t *testing.T) {
	e := Envelope{
		Flags: FlagNegative,
		Soft:  0x0102030405060708,
		Hard:  0x1112131415161718,
		Delta: 0x2122232425262728,
		Fence: 0x001f_3233_3435_3637,
		Value: []byte("val"),
	}
	const want = "01" + "01" +
		"0102030405060708" + "1112131415161718" + "2122232425262728" + "001f323334353637" +
		"76616c"
	b := Append(nil, &e)
	if got := hex.EncodeToString(b); got != want {
		t.Fatalf("Append = %s\nwant     %s", got, want)
	}
	fields := []struct {
		name string
		off  int
		want string
	}{
		{"version", VersionOffset, "01"},
		{"flags", FlagsOffset, "01"},
		{"soft", SoftOffset, "0102030405060708"},
		{"hard", HardOffset, "1112131415161718"},
		{"delta", DeltaOffset, "2122232425262728"},
		{"fence", FenceOffset, "001f323334353637"},
		{"value", HeaderSize, "76616c"},
	}
	for _, f := range fields {
		if got := hex.EncodeToString(b[f.off : f.off+len(f.want)/2]); got != f.want {
			t.Errorf("%s at offset %d = %s, want %s", f.name, f.off, got, f.want)
		}
	}
	if HeaderSize > 40 {
		t.Errorf("HeaderSize = %d, want at most 40", HeaderSize)
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := Envelope{Soft: 1000, Hard: 2000, Delta: time.Millisecond, Fence: 7, Value: []byte("v")}
	// with returns valid's encoding with the 8 bytes at off set to v.
	with := func(off int, v uint64) []byte {
		b := Append(nil, &valid)
		for i := range 8 {
			b[off+i] = byte(v >> (56 - 8*i))
		}
		return b
	}
	withByte := func(off int, v byte) []byte {
		b := Append(nil, &valid)
		b[off] = v
		return b
	}
	tests := []struct {
		name   string
		b      []byte
		target error
		detail string
	}{
		{"nil", nil, ErrCorrupt, "empty"},
		{"empty", []byte{}, ErrCorrupt, "empty"},
		{"version 0", withByte(VersionOffset, 0), ErrUnknownVersion, "version 0"},
		{"version 2", withByte(VersionOffset, 2), ErrUnknownVersion, "version 2"},
		{"version 255 short", []byte{255}, ErrUnknownVersion, "version 255"},
		{"version only", []byte{Version}, ErrCorrupt, "1 bytes"},
		{"header minus one", Append(nil, &valid)[:HeaderSize-1], ErrCorrupt, "33 bytes"},
		{"flag bit 2", withByte(FlagsOffset, 4), ErrCorrupt, "flag bits 0x04"},
		{"all flag bits", withByte(FlagsOffset, 0xff), ErrCorrupt, "flag bits 0xfc"},
		{"tagged without tags", withByte(FlagsOffset, byte(FlagTagged)), ErrCorrupt, "tags section"},
		{"negative soft", with(SoftOffset, 1<<63), ErrCorrupt, "negative soft"},
		{"negative hard", with(HardOffset, math.MaxUint64), ErrCorrupt, "hard expiry -1 before"},
		{"hard before soft", with(HardOffset, 999), ErrCorrupt, "hard expiry 999 before soft expiry 1000"},
		{"negative delta", with(DeltaOffset, math.MaxUint64), ErrCorrupt, "negative delta"},
		{"fence 2^53", with(FenceOffset, 1<<53), ErrCorrupt, "fence 9007199254740992"},
		{"fence max", with(FenceOffset, math.MaxUint64), ErrCorrupt, "fence"},
		{"hard past MaxExpiry", with(HardOffset, uint64(MaxExpiry)+1), ErrCorrupt, "after MaxExpiry"},
		{"hard MaxInt64", with(HardOffset, math.MaxInt64), ErrCorrupt, "after MaxExpiry"},
		{"year 3000", with(HardOffset, uint64(time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()*1000)), ErrCorrupt, "after MaxExpiry"},
	}
	for _, tt := range tests {
		e, err := Decode(tt.b)
		if !errors.Is(err, tt.target) {
			t.Errorf("%s: Decode = %+v, %v; want %v", tt.name, e, err, tt.target)
			continue
		}
		if !strings.HasPrefix(err.Error(), "envelope: ") || !strings.Contains(err.Error(), tt.detail) {
			t.Errorf("%s: error %q should start with envelope: and hold %q", tt.name, err, tt.detail)
		}
		if !equal(e, Envelope{}) {
			t.Errorf("%s: Decode returned %+v with its error", tt.name, e)
		}
	}
	if got := time.UnixMilli(MaxExpiry).UTC(); got.UnixNano()/int64(time.Millisecond) != MaxExpiry || got.Year() != 2262 {
		t.Errorf("MaxExpiry is %v; want the last millisecond whose nanoseconds fit an int64", got)
	}
	// The boundaries themselves are valid.
	for _, e := range []Envelope{
		{Soft: 5, Hard: 5},
		{Fence: MaxFence},
		{Soft: MaxExpiry, Hard: MaxExpiry, Delta: math.MaxInt64},
	} {
		if _, err := Decode(Append(nil, &e)); err != nil {
			t.Errorf("Decode(Append(%+v)): %v", e, err)
		}
	}
}

func TestDecodeAliasesInput(t *testing.T) {
	b := Append(nil, &Envelope{Value: []byte("abc")})
	b = append(b, "zz"...)[:len(b)] // spare capacity after the value
	e, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	b[HeaderSize] = 'X'
	if string(e.Value) != "Xbc" {
		t.Errorf("Value = %q after changing the input; want it to alias the input", e.Value)
	}
	if cap(e.Value) != len(e.Value) {
		t.Errorf("cap(Value) = %d, want %d so appends cannot write past the input", cap(e.Value), len(e.Value))
	}
}

func TestSetFence(t *testing.T) {
	e := Envelope{Soft: 10, Hard: 20, Delta: 3, Fence: 1, Value: []byte("value")}
	b := Append(nil, &e)
	if err := SetFence(b, 42); err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	e.Fence = 42
	if !equal(got, e) {
		t.Errorf("after SetFence(42): %+v, want %+v", got, e)
	}
	if err := SetFence(b, MaxFence); err != nil {
		t.Errorf("SetFence(MaxFence): %v", err)
	}

	before := bytes.Clone(b)
	if err := SetFence(b, MaxFence+1); err == nil || !strings.HasPrefix(err.Error(), "envelope: ") {
		t.Errorf("SetFence(2^53) = %v, want an envelope: error", err)
	}
	if !bytes.Equal(b, before) {
		t.Error("a failed SetFence changed the envelope")
	}
	if err := SetFence(b[:HeaderSize-1], 1); !errors.Is(err, ErrCorrupt) {
		t.Errorf("SetFence on a short header = %v, want ErrCorrupt", err)
	}
	b[VersionOffset] = 9
	if err := SetFence(b, 1); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("SetFence on version 9 = %v, want ErrUnknownVersion", err)
	}
	b[VersionOffset] = Version
	if !bytes.Equal(b, before) {
		t.Error("a failed SetFence changed the envelope")
	}
}

func TestAllocs(t *testing.T) {
	e := Envelope{Soft: 1, Hard: 2, Value: make([]byte, 1024)}
	b := Append(nil, &e)
	if n := testing.AllocsPerRun(100, func() { _, _ = Decode(b) }); n != 0 {
		t.Errorf("Decode makes %v allocations, want 0", n)
	}
	dst := make([]byte, 0, 2048)
	if n := testing.AllocsPerRun(100, func() { dst = Append(dst[:0], &e) }); n != 0 {
		t.Errorf("Append into a reused buffer makes %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Append(nil, &e) }); n != 1 {
		t.Errorf("Append into nil makes %v allocations, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = SetFence(b, 3) }); n != 0 {
		t.Errorf("SetFence makes %v allocations, want 0", n)
	}
}

func FuzzDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		e := randomEnvelope(r)
		b := Append(nil, &e)
		f.Add(b)
		f.Add(b[:r.IntN(len(b))]) // a truncation
	}
	f.Add(Append(nil, &Envelope{}))
	f.Add(Append(nil, &Envelope{Flags: FlagNegative, Soft: 1, Hard: 1, Fence: MaxFence}))
	f.Add(Append(nil, &Envelope{Flags: FlagTagged, Soft: 1, Hard: 2, Tags: []string{"a", "", "{t}"}, Since: 1 << 50, Value: []byte("v")}))
	f.Add(Append(nil, &Envelope{Flags: FlagTagged | FlagNegative, Tags: []string{"x"}}))
	f.Add([]byte{})
	f.Add([]byte{Version})
	f.Add([]byte{2, 0, 0})
	f.Add([]byte("garbage that is longer than one header, not an envelope"))
	f.Add(bytes.Repeat([]byte{0xff}, HeaderSize+3))
	// Extremes: 0, 2^53, MaxExpiry ± 1 and MaxInt64 in every numeric field.
	for _, x := range []int64{0, 1 << 53, MaxExpiry - 1, MaxExpiry, MaxExpiry + 1, math.MaxInt64} {
		f.Add(Append(nil, &Envelope{Soft: x, Hard: x, Delta: time.Duration(x), Fence: uint64(x)}))
		f.Add(Append(nil, &Envelope{Soft: 0, Hard: x, Fence: MaxFence}))
		f.Add(Append(nil, &Envelope{Soft: x, Hard: math.MaxInt64, Fence: MaxFence + 1}))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("Decode error %v wraps neither sentinel", err)
			}
			return
		}
		if again := Append(nil, &e); !bytes.Equal(again, b) {
			t.Fatalf("Decode then Append changed the bytes:\n in  %x\n out %x", b, again)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("Decode returned an envelope that Validate rejects: %v", err)
		}
		for _, ms := range []int64{e.Soft, e.Hard} {
			if ms < 0 || ms > MaxExpiry || ms > math.MaxInt64/int64(time.Millisecond) {
				t.Fatalf("Decode accepted expiry %d ms, outside [0, MaxExpiry]", ms)
			}
			if ns := ms * int64(time.Millisecond); ns/int64(time.Millisecond) != ms {
				t.Fatalf("expiry %d ms overflows int64 nanoseconds", ms)
			}
		}
		if e.Fence > MaxFence {
			t.Fatalf("Decode accepted fence %d above MaxFence", e.Fence)
		}
	})
}

// benchEnvelope is a typical entry: a 1 KiB value.
func benchEnvelope() Envelope {
	now := time.Now().UnixMilli()
	return Envelope{Soft: now + 60_000, Hard: now + 120_000, Delta: 250 * time.Millisecond, Fence: 12345, Value: bytes.Repeat([]byte("x"), 1024)}
}

// The standard alternative to the binary header is encoding/json of the same
// struct.
func BenchmarkEncode(b *testing.B) {
	e := benchEnvelope()
	b.Run("envelope", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(HeaderSize + len(e.Value)))
		dst := make([]byte, 0, 2048)
		for b.Loop() {
			dst = Append(dst[:0], &e)
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(HeaderSize + len(e.Value)))
		for b.Loop() {
			if _, err := json.Marshal(&e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	e := benchEnvelope()
	b.Run("envelope", func(b *testing.B) {
		in := Append(nil, &e)
		b.ReportAllocs()
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			if _, err := Decode(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		in, err := json.Marshal(&e)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.SetBytes(int64(HeaderSize + len(e.Value)))
		for b.Loop() {
			var out Envelope
			if err := json.Unmarshal(in, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestTaggedRoundTrip(t *testing.T) {
	e := Envelope{Flags: FlagTagged, Soft: 5, Hard: 9, Delta: 3, Fence: 7, Tags: []string{"product:42", "", "cat\x00"}, Since: 1796193311518878, Value: []byte("value")}
	b := Append(nil, &e)
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Tags, e.Tags) || got.Since != e.Since || string(got.Value) != "value" || got.Fence != 7 {
		t.Errorf("Decode(Append(e)) = %+v, want %+v", got, e)
	}
	if err := SetFence(b, 11); err != nil {
		t.Fatal(err)
	}
	if got, _ := Decode(b); got.Fence != 11 || !slices.Equal(got.Tags, e.Tags) {
		t.Errorf("after SetFence: %+v", got)
	}
	if err := (&Envelope{Tags: []string{"t"}}).Validate(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Validate of a tag without FlagTagged = %v, want ErrCorrupt", err)
	}
	for _, bad := range []Envelope{
		{Flags: FlagTagged}, // no tag
		{Flags: FlagTagged, Tags: make([]string, MaxTags+1)},
		{Flags: FlagTagged, Tags: []string{strings.Repeat("x", MaxTagLen+1)}},
	} {
		if _, err := Decode(Append(nil, &bad)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Decode of %d tags, flags %v = %v, want ErrCorrupt", len(bad.Tags), bad.Flags, err)
		}
	}
}
