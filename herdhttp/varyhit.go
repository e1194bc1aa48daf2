package herdhttp

import (
	"bytes"
	"net/http"
)

// Limits of the values a hit normalises on the stack; past them, a
// request's values are normalised by varyValues.
const (
	maxHitVary    = 8   // fields a response varies on
	maxHitMembers = 16  // members of one Accept-Encoding
	hitVaryBuf    = 256 // bytes of all the values
)

// hitVary holds the normalised values of the fields a response varies on
// in one request, as varyValues gives them, built without allocating:
// value i is buf[ends[i-1]:ends[i]].
type hitVary struct {
	buf  []byte
	ends [maxHitVary]int
	n    int
}

func (v *hitVary) value(i int) []byte {
	start := 0
	if i > 0 {
		start = v.ends[i-1]
	}
	return v.buf[start:v.ends[i]]
}

// equal reports whether the values are values.
func (v *hitVary) equal(values []string) bool {
	if len(values) != v.n {
		return false
	}
	for i, s := range values {
		if string(v.value(i)) != s {
			return false
		}
	}
	return true
}

// fnv is the FNV-1a hash appendVariantKey takes of the values.
func (v *hitVary) fnv() uint64 {
	h := uint64(fnvOffset)
	for i := range v.n {
		for _, ch := range v.value(i) {
			h = (h ^ uint64(ch)) * fnvPrime
		}
		h *= fnvPrime // the zero byte after each value
	}
	return h
}

// hitVaryValues returns r's values of names normalised, with buf as their
// storage, and reports whether it could: false for more names or members
// than it holds, for a non-ASCII byte, or for an Accept-Encoding member
// with parameters, which varyValues normalises instead.
func hitVaryValues(buf []byte, r *http.Request, names []string) (v hitVary, ok bool) {
	if len(names) > maxHitVary {
		return v, false
	}
	b := buf[:0]
	for i, name := range names {
		if b, ok = appendNormalized(b, name, r.Header[name]); !ok {
			return v, false
		}
		v.ends[i] = len(b)
	}
	v.buf, v.n = b, len(names)
	return v, true
}

// appendNormalized appends normalizeField(name, lines) to b, or reports
// false.
func appendNormalized(b []byte, name string, lines []string) ([]byte, bool) {
	lower := false
	switch name {
	case "Accept-Encoding":
		return appendCodings(b, lines)
	case "Accept", "Accept-Language", "Accept-Charset":
		lower = true
	}
	first := true
	for _, line := range lines {
		for len(line) > 0 {
			var m string
			m, line = cutComma(line)
			start := len(b)
			if !first {
				b = append(b, ',')
			}
			mstart := len(b)
			var ok bool
			if b, ok = appendMember(b, m, lower); !ok {
				return b, false
			}
			if len(b) == mstart {
				b = b[:start] // an empty member is dropped
				continue
			}
			first = false
		}
	}
	return b, true
}

// appendCodings appends the Accept-Encoding form of normalizeField: the
// codings, lower case, sorted, without duplicates, joined by commas.
func appendCodings(b []byte, lines []string) ([]byte, bool) {
	var scratch [hitVaryBuf]byte
	var spans [maxHitMembers][2]int
	n := 0
	s := scratch[:0]
	for _, line := range lines {
		for len(line) > 0 {
			var m string
			m, line = cutComma(line)
			start := len(s)
			var ok bool
			if s, ok = appendMember(s, m, true); !ok {
				return b, false
			}
			if len(s) == start {
				continue
			}
			if bytes.IndexByte(s[start:], ';') >= 0 || n == maxHitMembers || len(s) > hitVaryBuf {
				return b, false // parameters (a q-value), or too many
			}
			spans[n] = [2]int{start, len(s)}
			n++
		}
	}
	// insertion sort: a handful of codings
	for i := 1; i < n; i++ {
		for j := i; j > 0 && bytes.Compare(s[spans[j][0]:spans[j][1]], s[spans[j-1][0]:spans[j-1][1]]) < 0; j-- {
			spans[j], spans[j-1] = spans[j-1], spans[j]
		}
	}
	for i := range n {
		c := s[spans[i][0]:spans[i][1]]
		if i > 0 {
			if bytes.Equal(c, s[spans[i-1][0]:spans[i-1][1]]) {
				continue
			}
			b = append(b, ',')
		}
		b = append(b, c...)
	}
	return b, true
}

// cutComma splits a field line at its first comma.
func cutComma(line string) (member, rest string) {
	for i := 0; i < len(line); i++ {
		if line[i] == ',' {
			return line[:i], line[i+1:]
		}
	}
	return line, ""
}

// appendMember appends m as normalizeField normalises a list member:
// runs of white space made one space and trimmed, the spaces beside a
// semicolon dropped; lower-cased when lower is set. A non-ASCII byte
// gives false.
func appendMember(b []byte, m string, lower bool) ([]byte, bool) {
	start := len(b)
	space := false // a space is pending: written before the next byte
	for i := 0; i < len(m); i++ {
		ch := m[i]
		if ch >= 0x80 {
			return b, false
		}
		if asciiSpace(ch) {
			space = true
			continue
		}
		if space && len(b) > start && ch != ';' && b[len(b)-1] != ';' {
			b = append(b, ' ')
		}
		space = false
		if lower && 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		b = append(b, ch)
	}
	return b, true
}

// asciiSpace reports whether ch is an ASCII byte unicode.IsSpace counts.
func asciiSpace(ch byte) bool {
	switch ch {
	case ' ', '\t', '\n', '\v', '\f', '\r':
		return true
	}
	return false
}
