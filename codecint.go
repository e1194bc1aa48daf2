package herd

import (
	"math"
	"strconv"
	"unsafe"
)

// The JSON codec's path for the predeclared integer types: what
// encoding/json writes for them and reads into them, without reflection.
// Anything else, and any input that is not a plain integer literal that
// fits, takes encoding/json's path, which gives the same value or error.

// appendInt appends the JSON of *p to b when V is a predeclared integer
// type, and reports whether it was.
func appendInt[V any](b []byte, p *V) ([]byte, bool) {
	ptr := unsafe.Pointer(p)
	switch any(p).(type) {
	case *int:
		return strconv.AppendInt(b, int64(*(*int)(ptr)), 10), true
	case *int8:
		return strconv.AppendInt(b, int64(*(*int8)(ptr)), 10), true
	case *int16:
		return strconv.AppendInt(b, int64(*(*int16)(ptr)), 10), true
	case *int32:
		return strconv.AppendInt(b, int64(*(*int32)(ptr)), 10), true
	case *int64:
		return strconv.AppendInt(b, *(*int64)(ptr), 10), true
	case *uint:
		return strconv.AppendUint(b, uint64(*(*uint)(ptr)), 10), true
	case *uint8:
		return strconv.AppendUint(b, uint64(*(*uint8)(ptr)), 10), true
	case *uint16:
		return strconv.AppendUint(b, uint64(*(*uint16)(ptr)), 10), true
	case *uint32:
		return strconv.AppendUint(b, uint64(*(*uint32)(ptr)), 10), true
	case *uint64:
		return strconv.AppendUint(b, *(*uint64)(ptr), 10), true
	}
	return b, false
}

// parseInt sets *p from data when V is a predeclared integer type and data
// is a JSON integer literal, with nothing around it, whose value V holds;
// it reports whether it did.
func parseInt[V any](data []byte, p *V) bool {
	ptr := unsafe.Pointer(p)
	switch any(p).(type) {
	case *int:
		n, ok := signed(data, strconv.IntSize)
		*(*int)(ptr) = int(n)
		return ok
	case *int8:
		n, ok := signed(data, 8)
		*(*int8)(ptr) = int8(n)
		return ok
	case *int16:
		n, ok := signed(data, 16)
		*(*int16)(ptr) = int16(n)
		return ok
	case *int32:
		n, ok := signed(data, 32)
		*(*int32)(ptr) = int32(n)
		return ok
	case *int64:
		n, ok := signed(data, 64)
		*(*int64)(ptr) = n
		return ok
	case *uint:
		n, ok := unsigned(data, strconv.IntSize)
		*(*uint)(ptr) = uint(n)
		return ok
	case *uint8:
		n, ok := unsigned(data, 8)
		*(*uint8)(ptr) = uint8(n)
		return ok
	case *uint16:
		n, ok := unsigned(data, 16)
		*(*uint16)(ptr) = uint16(n)
		return ok
	case *uint32:
		n, ok := unsigned(data, 32)
		*(*uint32)(ptr) = uint32(n)
		return ok
	case *uint64:
		n, ok := unsigned(data, 64)
		*(*uint64)(ptr) = n
		return ok
	}
	return false
}

// signed returns the value of the integer literal data when it fits in
// bits bits, two's complement; ok is false (and n 0) otherwise.
func signed(data []byte, bits int) (n int64, ok bool) {
	neg, mag, ok := literal(data)
	limit := uint64(1) << (bits - 1) // the magnitude of the least value
	switch {
	case !ok:
		return 0, false
	case neg && mag <= limit:
		return int64(-mag), true // -mag wraps to the least value at the limit
	case !neg && mag < limit:
		return int64(mag), true
	}
	return 0, false
}

// unsigned returns the value of the integer literal data when it is not
// negative and fits in bits bits; ok is false (and n 0) otherwise.
func unsigned(data []byte, bits int) (n uint64, ok bool) {
	neg, mag, ok := literal(data)
	if !ok || neg || (bits < 64 && mag >= uint64(1)<<bits) {
		return 0, false
	}
	return mag, true
}

// literal reads data as a JSON number that is an integer literal: an
// optional minus, then 0 or a digit 1–9 followed by digits, nothing else.
// ok is false when data is not one or its magnitude exceeds 64 bits.
func literal(data []byte) (neg bool, mag uint64, ok bool) {
	if len(data) > 0 && data[0] == '-' {
		neg, data = true, data[1:]
	}
	if len(data) == 0 || (data[0] == '0' && len(data) > 1) {
		return false, 0, false
	}
	const cutoff, lastDigit = math.MaxUint64 / 10, math.MaxUint64 % 10
	for _, c := range data {
		d := uint64(c) - '0'
		if d > 9 || mag > cutoff || mag == cutoff && d > lastDigit {
			return false, 0, false // mag*10 + d would pass 2^64-1
		}
		mag = mag*10 + d
	}
	return neg, mag, true
}
