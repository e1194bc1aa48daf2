package herd

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

type codecUser struct {
	Name  string         `json:"name"`
	Age   int            `json:"age"`
	Tags  []string       `json:"tags,omitempty"`
	Score map[string]int `json:"score,omitempty"`
	Boss  *codecUser     `json:"boss,omitempty"`
}

func TestJSONRoundTrip(t *testing.T) {
	c := JSON[codecUser]()
	in := codecUser{Name: "ada|\\", Age: 36, Tags: []string{"a", ""}, Score: map[string]int{"x": 1}, Boss: &codecUser{Name: "b"}}
	b, err := c.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("Marshal = %q, not JSON", b)
	}
	out, err := c.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip = %+v, want %+v", out, in)
	}
}

func TestJSONErrors(t *testing.T) {
	c := JSON[codecUser]()
	for _, data := range []string{"", "{", `{"name":"a","age":"x"}`, "null garbage", "\xff"} {
		v, err := c.Unmarshal([]byte(data))
		if err == nil {
			t.Errorf("Unmarshal(%q) = %+v, nil; want an error", data, v)
			continue
		}
		if !strings.HasPrefix(err.Error(), "herd: codec: ") {
			t.Errorf("Unmarshal(%q) error %q lacks the herd: codec: prefix", data, err)
		}
		if !reflect.DeepEqual(v, codecUser{}) {
			t.Errorf("Unmarshal(%q) returned %+v with its error, want the zero value", data, v)
		}
	}
	var syntax *json.SyntaxError
	if _, err := c.Unmarshal([]byte("{x")); !errors.As(err, &syntax) {
		t.Errorf("Unmarshal({x) error %v does not wrap *json.SyntaxError", err)
	}
	_, err := JSON[float64]().Marshal(math.NaN())
	var unsupported *json.UnsupportedValueError
	if !errors.As(err, &unsupported) || !strings.HasPrefix(err.Error(), "herd: codec: ") {
		t.Errorf("Marshal(NaN) error = %v, want a herd: codec: error wrapping *json.UnsupportedValueError", err)
	}
}

func TestBytesZeroCopy(t *testing.T) {
	c := Bytes()
	data := []byte("payload")
	v, err := c.Unmarshal(data)
	if err != nil || unsafe.SliceData(v) != unsafe.SliceData(data) || len(v) != len(data) {
		t.Errorf("Unmarshal = %p len %d, %v; want data itself (%p len %d)", v, len(v), err, data, len(data))
	}
	b, err := c.Marshal(data)
	if err != nil || unsafe.SliceData(b) != unsafe.SliceData(data) || len(b) != len(data) {
		t.Errorf("Marshal = %p len %d, %v; want its argument (%p)", b, len(b), err, data)
	}
	if v, err := c.Unmarshal(nil); err != nil || v != nil {
		t.Errorf("Unmarshal(nil) = %v, %v; want nil, nil", v, err)
	}
}

func TestStringZeroCopy(t *testing.T) {
	c := String()
	data := []byte("payload")
	s, err := c.Unmarshal(data)
	if err != nil || s != "payload" || unsafe.StringData(s) != unsafe.SliceData(data) {
		t.Errorf("Unmarshal = %q, %v; want a string aliasing data", s, err)
	}
	in := strings.Repeat("ab", 8)
	b, err := c.Marshal(in)
	if err != nil || string(b) != in || unsafe.SliceData(b) != unsafe.StringData(in) {
		t.Errorf("Marshal = %q, %v; want the string's own bytes", b, err)
	}
	for _, empty := range [][]byte{nil, {}} {
		if s, err := c.Unmarshal(empty); err != nil || s != "" {
			t.Errorf("Unmarshal(%#v) = %q, %v; want \"\", nil", empty, s, err)
		}
	}
	if b, err := c.Marshal(""); err != nil || len(b) != 0 {
		t.Errorf("Marshal(\"\") = %q, %v", b, err)
	}
}

type namedBytes []byte

func TestDefaultCodec(t *testing.T) {
	data := []byte("payload")

	b, err := DefaultCodec[[]byte]().Unmarshal(data)
	if err != nil || unsafe.SliceData(b) != unsafe.SliceData(data) {
		t.Errorf("DefaultCodec[[]byte] copied or failed: %q, %v", b, err)
	}
	s, err := DefaultCodec[string]().Unmarshal(data)
	if err != nil || s != "payload" || unsafe.StringData(s) != unsafe.SliceData(data) {
		t.Errorf("DefaultCodec[string] copied or failed: %q, %v", s, err)
	}

	// Every other type is JSON, named byte slices and interfaces included.
	if got, err := DefaultCodec[codecUser]().Marshal(codecUser{Name: "a"}); err != nil || string(got) != `{"name":"a","age":0}` {
		t.Errorf("DefaultCodec[codecUser].Marshal = %s, %v", got, err)
	}
	if got, err := DefaultCodec[namedBytes]().Marshal(namedBytes("hi")); err != nil || string(got) != `"aGk="` {
		t.Errorf("DefaultCodec[namedBytes].Marshal = %s, %v; want base64 JSON", got, err)
	}
	if got, err := DefaultCodec[any]().Marshal("hi"); err != nil || string(got) != `"hi"` {
		t.Errorf("DefaultCodec[any].Marshal = %s, %v; want JSON", got, err)
	}
	if got, err := DefaultCodec[*string]().Unmarshal([]byte(`"x"`)); err != nil || got == nil || *got != "x" {
		t.Errorf("DefaultCodec[*string].Unmarshal = %v, %v; want JSON", got, err)
	}
}

// FuzzJSONUnmarshal checks that any input decodes to a value or an error,
// never a panic, and that a decoded value's encoding survives a round trip
// (the values themselves may not: omitempty turns an empty slice into nil).
func FuzzJSONUnmarshal(f *testing.F) {
	for _, s := range []string{
		`{"name":"ada","age":36,"tags":["a"],"score":{"x":1},"boss":{"name":"b"}}`,
		`{}`, `null`, `[]`, `{"age":1e400}`, `{"name":"\ud800"}`, "{\"name\":\"\xff\"}",
		`{"boss":{"boss":{"boss":null}}}`, `{"tags":null}`, `{"tAgs":[]}`, `{`, ``, `"x"`,
	} {
		f.Add([]byte(s))
	}
	c := JSON[codecUser]()
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := c.Unmarshal(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "herd: codec: ") {
				t.Fatalf("error %q lacks the herd: codec: prefix", err)
			}
			return
		}
		b, err := c.Marshal(v)
		if err != nil {
			t.Fatalf("Marshal(%+v) after a successful Unmarshal: %v", v, err)
		}
		again, err := c.Unmarshal(b)
		if err != nil {
			t.Fatalf("Unmarshal(%q) of a Marshal result: %v", b, err)
		}
		if b2, err := c.Marshal(again); err != nil || !bytes.Equal(b2, b) {
			t.Fatalf("encoding %q decoded and encoded again to %q, %v", b, b2, err)
		}
	})
}
