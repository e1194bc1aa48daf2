package herd

import (
	"encoding/json"
	"fmt"
	"unsafe"
)

// Codec turns values into the bytes the remote tier stores and back.
// Implementations must be safe for concurrent use.
type Codec[V any] interface {
	// Marshal encodes v. The cache never modifies the bytes it returns, so
	// they may alias v.
	Marshal(v V) ([]byte, error)
	// Unmarshal decodes data. The cache never modifies data after the call,
	// so the value may alias it.
	Unmarshal(data []byte) (V, error)
}

// JSON returns a Codec that encodes values with encoding/json. Its errors
// are prefixed "herd: codec: " and wrap those of encoding/json. Values of
// the predeclared integer types (int, int8 … uint64, not types named after
// them) take a shorter path with the same results: one allocation to
// encode, none to decode.
func JSON[V any]() Codec[V] { return jsonCodec[V]{} }

type jsonCodec[V any] struct{}

func (jsonCodec[V]) Marshal(v V) ([]byte, error) {
	if b, ok := appendInt(nil, &v); ok {
		return b, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("herd: codec: %w", err)
	}
	return b, nil
}

func (jsonCodec[V]) Unmarshal(data []byte) (V, error) {
	var v V
	if parseInt(data, &v) {
		return v, nil
	}
	// Another variable than v, so that v need not escape to the heap.
	var w V
	if err := json.Unmarshal(data, &w); err != nil {
		var zero V
		return zero, fmt.Errorf("herd: codec: %w", err)
	}
	return w, nil
}

// Bytes returns the passthrough Codec for byte slices: Marshal returns its
// argument and Unmarshal returns data itself, without copying. A value that
// Unmarshal returns shares memory with the stored entry and with every other
// caller given the same value: it must not be modified. Bytes never fails.
func Bytes() Codec[[]byte] { return bytesCodec{} }

type bytesCodec struct{}

func (bytesCodec) Marshal(v []byte) ([]byte, error)      { return v, nil }
func (bytesCodec) Unmarshal(data []byte) ([]byte, error) { return data, nil }

// String returns the Codec for strings that copies nothing: Marshal returns
// the string's own bytes and Unmarshal returns a string that aliases data.
// Strings are immutable, so both directions rely on the bytes never being
// modified: the cache never modifies them, and a caller that hands bytes to
// Unmarshal itself must not modify them afterwards. String never fails.
func String() Codec[string] { return stringCodec{} }

type stringCodec struct{}

func (stringCodec) Marshal(v string) ([]byte, error) {
	return unsafe.Slice(unsafe.StringData(v), len(v)), nil
}

func (stringCodec) Unmarshal(data []byte) (string, error) {
	return unsafe.String(unsafe.SliceData(data), len(data)), nil
}

// DefaultCodec returns the Codec a cache of V uses when none is given: Bytes
// for []byte, String for string, JSON for every other type (named byte-slice
// and string types included).
func DefaultCodec[V any]() Codec[V] {
	switch any((*V)(nil)).(type) {
	case *[]byte:
		return any(Bytes()).(Codec[V])
	case *string:
		return any(String()).(Codec[V])
	}
	return JSON[V]()
}
