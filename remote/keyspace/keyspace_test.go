package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

func TestNewRejectsBraces(t *testing.T) {
	for _, p := range []string{"{", "}", "herd{", "a}b", "{x}:"} {
		s, err := New(p)
		if err == nil {
			t.Errorf("New(%q) = %v, nil; want an error", p, s)
			continue
		}
		if !strings.HasPrefix(err.Error(), "keyspace: ") {
			t.Errorf("New(%q) error %q lacks the package prefix", p, err)
		}
	}
	for _, p := range []string{"", "herd:", "app:cache:", "ü\xff"} {
		s, err := New(p)
		if err != nil {
			t.Errorf("New(%q): %v", p, err)
		} else if s.Prefix() != p {
			t.Errorf("New(%q).Prefix() = %q", p, s.Prefix())
		}
	}
}

func TestNamesLayout(t *testing.T) {
	s, err := New("herd:")
	if err != nil {
		t.Fatal(err)
	}
	const key = "users|tenant-7|42"
	sum := sha256.Sum256([]byte(key))
	tag := hex.EncodeToString(sum[:8])
	got := s.Names(key)
	want := Names{
		Tag:   tag,
		Value: "herd:{" + tag + "}:" + key + ":v",
		Lease: "herd:{" + tag + "}:" + key + ":l",
		Fence: "herd:{" + tag + "}:" + key + ":f",
	}
	if got != want {
		t.Errorf("Names(%q) = %+v, want %+v", key, got, want)
	}
	if got := s.Channel(); got != "herd:events" {
		t.Errorf("Channel() = %q, want herd:events", got)
	}
	if got := (Space{}).Names("k").Value; !strings.HasPrefix(got, "{") {
		t.Errorf("zero Space Value name %q should start with the tag", got)
	}
}

func TestNamesTagShape(t *testing.T) {
	var s Space
	for _, key := range []string{"", "a", "{}", "}{", strings.Repeat("x", 1000)} {
		tag := s.Names(key).Tag
		if len(tag) != TagLen || strings.Trim(tag, "0123456789abcdef") != "" {
			t.Errorf("Names(%q).Tag = %q, want %d lowercase hex digits", key, tag, TagLen)
		}
	}
	if a, b := s.Names("a").Tag, s.Names("b").Tag; a == b {
		t.Errorf("tags of different keys are both %q", a)
	}
}

func TestNamesOneAllocation(t *testing.T) {
	s, _ := New("herd:")
	allocs := testing.AllocsPerRun(100, func() { _ = s.Names("users|tenant-7|42") })
	if allocs > 1 {
		t.Errorf("Names makes %v allocations, want at most 1", allocs)
	}
}

func TestCRC16(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16(123456789) = %#04x, want 0x31c3", got)
	}
	if got := crc16(""); got != 0 {
		t.Errorf("crc16(\"\") = %#04x, want 0", got)
	}
}

// TestSlotVectors compares Slot with CLUSTER KEYSLOT answers from a
// redis-server started with --cluster-enabled yes.
func TestSlotVectors(t *testing.T) {
	tests := []struct {
		name string
		want uint16
	}{
		{"foo", 12182},
		{"somekey", 11058},
		{"bar", 5061},
		{"hello", 866},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363},    // empty tag: whole name
		{"foo{{bar}}zap", 4015}, // tag is "{bar"
		{"foo{bar}{zap}", 5061}, // tag is "bar"
		{"{}", 15257},
		{"", 0},
		{"a}b{c}", 7365}, // a '}' before the first '{' does not count
		{"herd:{0123456789abcdef}:a{b}c:v", 10405},
		{"\xff\x00{\xfe}", 3793},
	}
	for _, tt := range tests {
		if got := Slot(tt.name); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// checkNames asserts what Names promises for one key.
func checkNames(t *testing.T, s Space, key string) {
	t.Helper()
	checkNamesAt(t, s, key, 0)
	checkNamesAt(t, s, key, 1)
	checkNamesAt(t, s, key, 1<<53-1)
}

// checkNamesAt checks key's names in generation gen: one slot, the key
// held, distinct from each other and from the names of generation gen+1.
func checkNamesAt(t *testing.T, s Space, key string, gen uint64) {
	t.Helper()
	n := s.NamesAt(key, gen)
	if gen == 0 && n != s.Names(key) {
		t.Fatalf("key %q: NamesAt(gen 0) = %+v, Names = %+v", key, n, s.Names(key))
	}
	mark := ""
	if gen > 0 {
		mark = fmt.Sprintf("#%d", gen)
	}
	want := Slot("{" + n.Tag + "}")
	next := s.NamesAt(key, gen+1)
	for i, name := range []string{n.Value, n.Lease, n.Fence} {
		if got := Slot(name); got != want {
			t.Fatalf("prefix %q key %q gen %d: Slot(%q) = %d, want the tag's slot %d", s.Prefix(), key, gen, name, got, want)
		}
		if !strings.HasPrefix(name, s.Prefix()+"{"+n.Tag+"}"+mark+":"+key+":") {
			t.Fatalf("prefix %q key %q gen %d: name %q does not hold the key", s.Prefix(), key, gen, name)
		}
		for _, other := range []string{next.Value, next.Lease, next.Fence} {
			if name == other {
				t.Fatalf("key %q: name %d of generation %d is also one of generation %d: %q", key, i, gen, gen+1, name)
			}
		}
		if name == s.Generation() {
			t.Fatalf("key %q: name %q is the generation key", key, name)
		}
	}
	if n.Value == n.Lease || n.Lease == n.Fence || n.Value == n.Fence {
		t.Fatalf("key %q: names not distinct: %+v", key, n)
	}
}

func TestNamesShareSlot(t *testing.T) {
	keys := []string{"", "{", "}", "{}", "}{", "{a}", "a{b}c", "{{}}", ":v", "\xff{\x00}", "users|tenant-7|42"}
	for _, p := range []string{"", "herd:", "app:cache:"} {
		s, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			checkNames(t, s, k)
		}
	}
}

func FuzzNamesShareSlot(f *testing.F) {
	for _, seed := range [][2]string{
		{"herd:", "users|tenant-7|42"},
		{"", "{}"},
		{"herd:", "}{x}"},
		{"p", "{a}{b}"},
		{"bad{", "k"},
		{"", "\xff\x00{\xfe}"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, prefix, key string) {
		s, err := New(prefix)
		if strings.ContainsAny(prefix, "{}") {
			if err == nil {
				t.Fatalf("New(%q) accepted a prefix with a brace", prefix)
			}
			return
		}
		if err != nil {
			t.Fatalf("New(%q): %v", prefix, err)
		}
		checkNames(t, s, key)
	})
}

func BenchmarkNames(b *testing.B) {
	s, _ := New("herd:")
	const key = "users|tenant-7|42"
	b.Run("Names", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Names(key)
		}
	})
	// The standard alternative: three concatenations and hex.EncodeToString.
	b.Run("concat", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sum := sha256.Sum256([]byte(key))
			tag := hex.EncodeToString(sum[:8])
			base := "herd:{" + tag + "}:" + key
			_ = Names{Tag: tag, Value: base + ":v", Lease: base + ":l", Fence: base + ":f"}
		}
	})
}
