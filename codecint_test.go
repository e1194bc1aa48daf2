package herd

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
)

// intInputs are JSON texts around the integer path's edges: bounds of each
// size, forms encoding/json reads that the path leaves to it (space,
// exponents, fractions, null), and texts that are not JSON numbers.
var intInputs = []string{
	"0", "-0", "1", "-1", "7", "42", "-42", "127", "128", "-128", "-129", "255", "256",
	"32767", "32768", "-32768", "-32769", "65535", "65536",
	"2147483647", "2147483648", "-2147483648", "-2147483649", "4294967295", "4294967296",
	"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
	"18446744073709551615", "18446744073709551616", "99999999999999999999", "-18446744073709551616",
	"00", "01", "-01", "-", "", " 1", "1 ", "1e3", "1.0", "1.5", "-1e0", "+1", "null", `"1"`, "1x", "0x1",
	"true", "[1]", "\u0661",
}

// sameAsJSON checks that JSON[V] reads and writes each input as
// encoding/json does.
func sameAsJSON[V comparable](t *testing.T, name string, inputs []string) {
	t.Helper()
	c := JSON[V]()
	for _, in := range inputs {
		var want V
		wantErr := json.Unmarshal([]byte(in), &want)
		got, err := c.Unmarshal([]byte(in))
		if (err != nil) != (wantErr != nil) || got != want {
			t.Errorf("%s: Unmarshal(%q) = %v, %v; encoding/json: %v, %v", name, in, got, err, want, wantErr)
			continue
		}
		if err != nil {
			continue
		}
		b, err := c.Marshal(got)
		wantB, _ := json.Marshal(want)
		if err != nil || string(b) != string(wantB) {
			t.Errorf("%s: Marshal(%v) = %s, %v; encoding/json: %s", name, got, b, err, wantB)
		}
	}
}

func TestJSONIntegersAsEncodingJSON(t *testing.T) {
	sameAsJSON[int](t, "int", intInputs)
	sameAsJSON[int8](t, "int8", intInputs)
	sameAsJSON[int16](t, "int16", intInputs)
	sameAsJSON[int32](t, "int32", intInputs)
	sameAsJSON[int64](t, "int64", intInputs)
	sameAsJSON[uint](t, "uint", intInputs)
	sameAsJSON[uint8](t, "uint8", intInputs)
	sameAsJSON[uint16](t, "uint16", intInputs)
	sameAsJSON[uint32](t, "uint32", intInputs)
	sameAsJSON[uint64](t, "uint64", intInputs)
	type named int // not predeclared: encoding/json's path
	sameAsJSON[named](t, "named", intInputs)
}

func TestJSONIntegerDecodeAllocatesNothing(t *testing.T) {
	c := JSON[int]()
	data := []byte(strconv.Itoa(math.MinInt64))
	if n := testing.AllocsPerRun(100, func() {
		if v, err := c.Unmarshal(data); err != nil || v != math.MinInt64 {
			t.Fatalf("Unmarshal(%s) = %d, %v", data, v, err)
		}
	}); n != 0 {
		t.Errorf("Unmarshal of an int allocates %v times, want 0", n)
	}
}

// FuzzJSONIntegers checks the integer path against encoding/json on any
// input.
func FuzzJSONIntegers(f *testing.F) {
	for _, s := range intInputs {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := []string{string(data)}
		sameAsJSON[int](t, "int", in)
		sameAsJSON[int8](t, "int8", in)
		sameAsJSON[uint16](t, "uint16", in)
		sameAsJSON[uint64](t, "uint64", in)
	})
}
