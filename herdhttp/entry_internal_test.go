package herdhttp

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

func sampleEntries() []*entry {
	return []*entry{
		{kind: kindResponse, flags: flagMustRevalidate, status: 200,
			header: http.Header{"Content-Type": {"text/plain"}, "X-Two": {"a", "b"}}, body: []byte("hello"),
			reqTime: 1, respTime: 2, dateValue: 3, ageValue: 4 * time.Second,
			lifetime: time.Minute, swr: time.Hour, sie: 24 * time.Hour, keep: time.Second,
			varyNames: []string{"Accept-Encoding"}, varyValues: []string{"br,gzip"}, herdSoft: 99},
		{kind: kindPass, reason: "set-cookie", header: http.Header{}, herdSoft: 5},
		{kind: kindIndex, varyNames: []string{"Accept", "X-V"}, header: http.Header{}, body: []byte{}},
	}
}

// Entries decode to what was encoded.
func TestEntryRoundTrip(t *testing.T) {
	for _, e := range sampleEntries() {
		got, err := decodeEntry(encodeEntry(e))
		if err != nil {
			t.Fatalf("decode %+v: %v", e, err)
		}
		if got.body == nil {
			got.body = []byte{}
		}
		if (got.hit != nil) != (got.kind == kindResponse) {
			t.Errorf("decoded %v: hit memo %v, want one for a response only", got.kind, got.hit)
		}
		got.hit = e.hit // the memo is the decoder's own, never stored
		if e.body == nil {
			e.body = []byte{}
		}
		if !reflect.DeepEqual(got, e) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, e)
		}
	}
}

// The decoder refuses anything it did not encode, and never panics;
// what it accepts encodes back to the same bytes, field order aside.
func FuzzDecodeEntry(f *testing.F) {
	for _, e := range sampleEntries() {
		b := encodeEntry(e)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{entryVersion, 1, 0, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			if e != nil {
				t.Fatal("an error with an entry")
			}
			return
		}
		again, err := decodeEntry(encodeEntry(e))
		if err != nil {
			t.Fatalf("re-encoding a decoded entry: %v", err)
		}
		if len(again.body) != len(e.body) || !reflect.DeepEqual(again.header, e.header) || again.kind != e.kind || again.lifetime != e.lifetime {
			t.Fatalf("re-encoded entry differs: %+v, %+v", again, e)
		}
	})
}
