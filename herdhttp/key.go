package herdhttp

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// primaryKey is the cache key of a GET or HEAD request: scheme, host,
// path and query (sorted when NormalizeQuery is set), then the values of
// the KeyHeaders fields (the lines of one joined by newlines), encoded as
// herd.Key("http", ...) encodes them, so that no two different requests
// share a key unless all of those are equal. GET and HEAD share the key:
// a HEAD is answered from a stored GET.
func (c *engine) primaryKey(r *http.Request) string {
	var buf [keyBuf]byte
	return string(c.appendPrimaryKey(buf[:0], r))
}

// keyBuf is the size of the stack buffer a key is built in; a longer key
// grows onto the heap.
const keyBuf = 256

// appendPrimaryKey appends r's primary key to b, without building the
// strings of its parts.
func (c *engine) appendPrimaryKey(b []byte, r *http.Request) []byte {
	host := r.Host
	if host == "" {
		host = r.URL.Host
	}
	b = append(b, "http"...)
	b = append(b, keySep)
	b = appendEscaped(b, c.scheme(r))
	b = append(b, keySep)
	for i := 0; i < len(host); i++ {
		ch := host[i]
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		b = appendEscapedByte(b, ch)
	}
	b = append(b, keySep)
	b = appendEscaped(b, r.URL.EscapedPath())
	b = append(b, keySep)
	if !c.o.NormalizeQuery || r.URL.RawQuery == "" {
		if r.URL.ForceQuery || r.URL.RawQuery != "" {
			b = append(b, '?')
			b = appendEscaped(b, r.URL.RawQuery)
		}
	} else {
		b = appendEscaped(b, c.query(r.URL))
	}
	for _, h := range c.keyHeaders {
		b = append(b, keySep)
		for i, v := range r.Header[h] {
			if i > 0 {
				b = append(b, '\n')
			}
			b = appendEscaped(b, v)
		}
	}
	return b
}

// The bytes herd.Key gives a meaning: the separator of the parts, and the
// escape that makes the byte after it literal.
const (
	keySep    = '|'
	keyEscape = '\\'
)

// appendEscaped appends s to b as herd.Key writes a part.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		b = appendEscapedByte(b, s[i])
	}
	return b
}

func appendEscapedByte(b []byte, ch byte) []byte {
	if ch == keySep || ch == keyEscape {
		b = append(b, keyEscape)
	}
	return append(b, ch)
}

// scheme is the request's scheme: its URL's when it has one (a client
// request), else https on a TLS connection and http otherwise.
func (c *engine) scheme(r *http.Request) string {
	switch {
	case r.URL.Scheme != "":
		return strings.ToLower(r.URL.Scheme)
	case r.TLS != nil:
		return "https"
	}
	return "http"
}

// query is the key's form of u's query: as sent, or with NormalizeQuery
// its parameters sorted by name (keeping the order of one name's values)
// and re-encoded, so that ?b=2&a=1 and ?a=1&b=2 share a key.
func (c *engine) query(u *url.URL) string {
	if !c.o.NormalizeQuery || u.RawQuery == "" {
		if u.ForceQuery || u.RawQuery != "" {
			return "?" + u.RawQuery
		}
		return ""
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return "?" + u.RawQuery // an unparsable query is its own key
	}
	return "?" + q.Encode()
}

// variantKey is the key of the variant bucket of primary for the
// normalised values of the fields it varies on: one of MaxVariants keys,
// so that a URL never has more variants stored than that. Values that
// share a bucket replace each other there; an entry is served only to a
// request whose values equal the ones it stores.
func (c *engine) variantKey(primary string, values []string) string {
	var buf [keyBuf]byte
	return string(c.appendVariantKey(buf[:0], primary, values))
}

// appendVariantKey appends variantKey(primary, values) to b:
// herd.Key("vary", primary, bucket), the bucket the FNV-1a hash of the
// values, each followed by a zero byte, modulo MaxVariants.
func (c *engine) appendVariantKey(b []byte, primary string, values []string) []byte {
	h := uint64(fnvOffset)
	for _, v := range values {
		for i := 0; i < len(v); i++ {
			h = (h ^ uint64(v[i])) * fnvPrime
		}
		h *= fnvPrime // the zero byte: h ^ 0 is h
	}
	return c.appendVariantBucket(b, primary, h)
}

// The parameters of 64-bit FNV-1a.
const fnvOffset, fnvPrime = 14695981039346656037, 1099511628211

// appendVariantBucket appends the variant key of primary whose values
// hash to h.
func (c *engine) appendVariantBucket(b []byte, primary string, h uint64) []byte {
	b = append(b, "vary"...)
	b = append(b, keySep)
	b = appendEscaped(b, primary)
	b = append(b, keySep)
	return strconv.AppendUint(b, h%uint64(c.o.MaxVariants), 10)
}

// varyNames parses the Vary field of a response: its field names,
// canonical, sorted and without duplicates; star reports a "*".
func varyNames(h http.Header) (names []string, star bool) {
	for _, line := range h.Values("Vary") {
		for f := range strings.SplitSeq(line, ",") {
			f = strings.TrimSpace(f)
			switch f {
			case "":
			case "*":
				star = true
			default:
				names = append(names, http.CanonicalHeaderKey(f))
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), star
}

// varyValues returns the normalised values of names in r.
func varyValues(r *http.Request, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = normalizeField(n, r.Header.Values(n))
	}
	return out
}

// normalizeField is the value of field name in a request, as the
// secondary key compares it (RFC 9111 §4.1 allows normalisation that keeps
// the field's semantics): the field lines joined by commas, the list
// members trimmed of whitespace. Accept-Encoding becomes its set of
// codings with a non-zero q-value, lower case and sorted; the other
// Accept fields, whose tokens are case-insensitive, are lower-cased.
func normalizeField(name string, lines []string) string {
	var members []string
	for _, line := range lines {
		for m := range strings.SplitSeq(line, ",") {
			m = strings.Join(strings.Fields(m), " ")
			m = strings.ReplaceAll(strings.ReplaceAll(m, " ;", ";"), "; ", ";")
			if m != "" {
				members = append(members, m)
			}
		}
	}
	switch name {
	case "Accept-Encoding":
		codings := members[:0]
		for _, m := range members {
			coding, params, _ := strings.Cut(strings.ToLower(m), ";")
			if zeroQ(params) {
				continue
			}
			codings = append(codings, coding)
		}
		slices.Sort(codings)
		return strings.Join(slices.Compact(codings), ",")
	case "Accept", "Accept-Language", "Accept-Charset":
		return strings.ToLower(strings.Join(members, ","))
	}
	return strings.Join(members, ",")
}

// zeroQ reports whether a member's parameters give it q=0.
func zeroQ(params string) bool {
	for p := range strings.SplitSeq(params, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if ok && strings.TrimSpace(k) == "q" {
			q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && q == 0
		}
	}
	return false
}
