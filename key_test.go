package herd

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// splitKey is SplitKey with ok for a nil error.
func splitKey(key string) (namespace string, parts []string, ok bool) {
	namespace, parts, err := SplitKey(key)
	return namespace, parts, err == nil
}

// fieldsOf splits data into a namespace and parts: data[0] is the separator
// and data[1:] is cut at every occurrence of it, so a fuzzer can put any byte
// value in the parts by choosing another separator. Empty data is the empty
// namespace with no parts; one cut gives no parts, n cuts give n parts.
func fieldsOf(data []byte) (string, []string) {
	if len(data) == 0 {
		return "", nil
	}
	fields := bytes.Split(data[1:], data[:1])
	parts := make([]string, 0, len(fields)-1)
	for _, f := range fields[1:] {
		parts = append(parts, string(f))
	}
	if len(parts) == 0 {
		parts = nil
	}
	return string(fields[0]), parts
}

func TestKeyReadable(t *testing.T) {
	tests := []struct {
		ns    string
		parts []string
		want  string
	}{
		{"users", []string{"tenant-7", "42"}, "users|tenant-7|42"},
		{"users", nil, "users"},
		{"users", []string{""}, "users|"},
		{"users", []string{"", ""}, "users||"},
		{"", nil, ""},
		{"", []string{""}, "|"},
		{"a|b", []string{`c\d`}, `a\|b|c\\d`},
		{"ünï", []string{"日本"}, "ünï|日本"},
		{"bin", []string{"\xff\x00"}, "bin|\xff\x00"},
	}
	for _, tt := range tests {
		if got := Key(tt.ns, tt.parts...); got != tt.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tt.ns, tt.parts, got, tt.want)
		}
		if n := keyLen(tt.ns, tt.parts); n != len(tt.want) {
			t.Errorf("keyLen(%q, %q) = %d, want %d", tt.ns, tt.parts, n, len(tt.want))
		}
	}
}

// TestKeyTrickyPairs checks that lists that naive joining would confuse give
// distinct keys, and that each key decodes back to its own list.
func TestKeyTrickyPairs(t *testing.T) {
	type list struct {
		ns    string
		parts []string
	}
	pairs := [][2]list{
		{{"a", []string{"b"}}, {"a|b", nil}},
		{{"a", []string{"b|c"}}, {"a", []string{"b", "c"}}},
		{{"a", nil}, {"a", []string{""}}},
		{{"a", []string{""}}, {"a", []string{"", ""}}},
		{{"", []string{"a"}}, {"a", nil}},
		{{"", nil}, {"", []string{""}}},
		{{"a|", []string{""}}, {"a", []string{"|"}}},
		{{`a\`, []string{"b"}}, {"a", []string{`\b`}}},
		{{`a\|b`, nil}, {`a\`, []string{"b"}}},
		{{"a", []string{`\|`}}, {"a", []string{`\`, ""}}},
		{{"a", []string{`|\`}}, {"a", []string{"", `\`}}},
		{{"tenant-1", []string{"2|x"}}, {"tenant-1|2", []string{"x"}}},
		{{"é", nil}, {"e\u0301", nil}},
		{{"\xff", nil}, {"\xfe", nil}},
		{{"a", []string{"\xff|"}}, {"a", []string{"\xff", ""}}},
	}
	for _, p := range pairs {
		k0, k1 := Key(p[0].ns, p[0].parts...), Key(p[1].ns, p[1].parts...)
		if k0 == k1 {
			t.Errorf("Key(%q, %q) and Key(%q, %q) are both %q", p[0].ns, p[0].parts, p[1].ns, p[1].parts, k0)
		}
		for i, l := range p {
			k := []string{k0, k1}[i]
			ns, parts, ok := splitKey(k)
			if !ok || ns != l.ns || !slices.Equal(parts, l.parts) {
				t.Errorf("splitKey(%q) = %q, %q, %v; want %q, %q", k, ns, parts, ok, l.ns, l.parts)
			}
		}
	}
}

func TestKeyOneAllocation(t *testing.T) {
	parts := []string{"tenant|7", `scope\read`, "42"}
	for _, tt := range []struct {
		name  string
		parts []string
	}{{"plain", []string{"tenant-7", "scope-read", "42"}}, {"escaped", parts}} {
		allocs := testing.AllocsPerRun(100, func() { _ = Key("users", tt.parts...) })
		if allocs != 1 {
			t.Errorf("%s: Key makes %v allocations, want 1", tt.name, allocs)
		}
	}
}

// FuzzKeyInjective checks, for two lists built from fuzz inputs, that their
// keys differ exactly when the lists differ, and that each key decodes to its
// list.
func FuzzKeyInjective(f *testing.F) {
	seeds := [][2]string{
		{"|a|b", "|a|b"},
		{"|a|b", "|a\\|b"},
		{"|a", "|a|"},
		{"|a|", "|a||"},
		{"/a|b", "/a/b"},
		{"/a\\", "/a/\\"},
		{"", "/"},
		{"\xff\xff\xfe", "\xff\xfe\xff"},
		{"\x00é\x00e\u0301", "\x00e\u0301\x00é"},
		{"|users|tenant-7|42", "|users|tenant-7|4|2"},
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		nsA, partsA := fieldsOf(a)
		nsB, partsB := fieldsOf(b)
		kA, kB := Key(nsA, partsA...), Key(nsB, partsB...)
		if n := keyLen(nsA, partsA); n != len(kA) {
			t.Fatalf("keyLen(%q, %q) = %d, but the key has %d bytes", nsA, partsA, n, len(kA))
		}
		same := nsA == nsB && slices.Equal(partsA, partsB)
		if same != (kA == kB) {
			t.Fatalf("lists (%q, %q) and (%q, %q): same lists %v, keys %q and %q", nsA, partsA, nsB, partsB, same, kA, kB)
		}
		for _, l := range []struct {
			ns    string
			parts []string
			key   string
		}{{nsA, partsA, kA}, {nsB, partsB, kB}} {
			ns, parts, ok := splitKey(l.key)
			if !ok || ns != l.ns || !slices.Equal(parts, l.parts) {
				t.Fatalf("splitKey(Key(%q, %q)) = %q, %q, %v", l.ns, l.parts, ns, parts, ok)
			}
		}
	})
}

// FuzzKeyRoundTrip checks that every key decodes to the list it was made
// from, which makes Key injective; and that every string splitKey accepts is
// the key of the list it decodes to, so the decoder is exact.
func FuzzKeyRoundTrip(f *testing.F) {
	for _, s := range []string{"", "|", "||", `\`, `\|`, `\\`, "a|b", `a\|b|c\\d`, "\xff\x00|\xfe", "ü|日本|"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// s as a key: if it decodes, encoding the result gives s back.
		if ns, parts, ok := splitKey(s); ok {
			if k := Key(ns, parts...); k != s {
				t.Fatalf("Key(splitKey(%q)) = %q", s, k)
			}
		}
		// s as input: split at its first byte, encode, decode.
		ns, parts := fieldsOf([]byte(s))
		k := Key(ns, parts...)
		gotNS, gotParts, ok := splitKey(k)
		if !ok || gotNS != ns || !slices.Equal(gotParts, parts) {
			t.Fatalf("splitKey(Key(%q, %q)) = %q, %q, %v", ns, parts, gotNS, gotParts, ok)
		}
	})
}

func BenchmarkKey(b *testing.B) {
	parts := []string{"tenant-7", "scope-read", "42"}
	b.Run("Key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Key("users", parts...)
		}
	})
	// The standard alternative, which is not injective.
	b.Run("strings.Join", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = "users|" + strings.Join(parts, "|")
		}
	})
}

func ExampleKey() {
	fmt.Println(Key("users", "tenant-7", "42"))
	fmt.Println(Key("search", "tenant-7", "q=a|b"))
	fmt.Println(Key("flags"))
	fmt.Println(Key("flags", ""))
	// Output:
	// users|tenant-7|42
	// search|tenant-7|q=a\|b
	// flags
	// flags|
}

func TestRedactKey(t *testing.T) {
	for _, tc := range []struct{ key, ns string }{
		{Key("users", "tenant-7", "42"), "users"},
		{Key(`a|b\`, "x"), `a\|b\\`},
		{Key("solo"), "solo"},
		{"", ""},
	} {
		got := RedactKey(tc.key)
		if !strings.HasPrefix(got, tc.ns+"#") || len(got) != len(tc.ns)+9 {
			t.Errorf("RedactKey(%q) = %q, want %q#<8 hex digits>", tc.key, got, tc.ns)
		}
		if strings.Contains(got, "tenant-7") {
			t.Errorf("RedactKey(%q) = %q shows a part", tc.key, got)
		}
	}
	if RedactKey(Key("u", "1")) == RedactKey(Key("u", "2")) {
		t.Error("two keys of one namespace share a redacted form")
	}
}

func ExampleSplitKey() {
	ns, parts, err := SplitKey(Key("search", "tenant-7", "q=a|b"))
	fmt.Println(ns, parts, err)
	_, _, err = SplitKey(`users|\x`)
	fmt.Println(err)
	// Output:
	// search [tenant-7 q=a|b] <nil>
	// herd: split key "users|\\x": the '\\' at byte 6 escapes nothing
}
