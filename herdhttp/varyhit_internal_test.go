package herdhttp

import (
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The values a hit normalises on the stack are varyValues', byte for
// byte, or it declines them.
func TestHitVaryValues(t *testing.T) {
	names := []string{"Accept", "Accept-Encoding", "Accept-Language", "X-Custom"}
	for _, lines := range [][]string{
		nil, {""}, {" "}, {","}, {" , ,"},
		{"gzip, deflate, br"}, {"br,gzip", "gzip"}, {"GZip ,  BR", "zstd"}, {"gzip;q=0"}, {"identity;q=0.5, *"},
		{"text/html ; level=1 ;q=0.9", "  a   b  "}, {"a ;b; c ; d"}, {"x\t \r y ;  ; z"}, {"é"}, {"a\u00a0b"},
		{"en-US,en;q=0.9"}, {";", " ; ", ";;", "a ; ; b"}, {strings.Repeat("c,", 40)}, {strings.Repeat("x", 300)},
	} {
		for _, name := range names {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if lines != nil {
				r.Header[name] = lines
			}
			var buf [hitVaryBuf]byte
			v, ok := hitVaryValues(buf[:], r, []string{name})
			if !ok {
				continue
			}
			want := varyValues(r, []string{name})
			if !v.equal(want) {
				t.Errorf("%s: %q: hit values %q, want %q", name, lines, v.value(0), want)
			}
		}
	}
}

func FuzzHitVaryValues(f *testing.F) {
	f.Add("gzip, deflate, br", "en-US,en;q=0.9", "text/html ; level=1")
	f.Add(" a ;b", "x\t,y", ";;")
	f.Fuzz(func(t *testing.T, ae, al, x string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Accept-Encoding"] = []string{ae}
		r.Header["Accept-Language"] = []string{al, x}
		r.Header["X-Custom"] = []string{x, ae}
		names := []string{"Accept-Encoding", "Accept-Language", "X-Custom"}
		var buf [hitVaryBuf]byte
		v, ok := hitVaryValues(buf[:], r, names)
		if !ok {
			return
		}
		want := varyValues(r, names)
		if !v.equal(want) {
			t.Errorf("hit values of %q: %q, want %q", r.Header, v.buf, want)
		}
		h := fnv.New64a()
		for _, s := range want {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
		if v.fnv() != h.Sum64() {
			t.Errorf("hash of %q differs", want)
		}
	})
}
