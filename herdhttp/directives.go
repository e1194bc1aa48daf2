package herdhttp

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// cacheControl is a parsed Cache-Control field (RFC 9111 §5.2): directive
// names in lower case, each with its argument (unquoted) or "" when it
// has none. A directive given twice keeps its first value.
type cacheControl map[string]string

// parseCacheControl parses every Cache-Control line of h. Malformed
// members are skipped.
func parseCacheControl(h http.Header) cacheControl {
	lines := h.Values("Cache-Control")
	if len(lines) == 0 {
		return nil
	}
	cc := cacheControl{}
	for _, line := range lines {
		for len(line) > 0 {
			var member string
			member, line = nextMember(line)
			name, arg, _ := strings.Cut(member, "=")
			name = strings.ToLower(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			arg = strings.TrimSpace(arg)
			if len(arg) >= 2 && arg[0] == '"' && arg[len(arg)-1] == '"' {
				arg = unquote(arg[1 : len(arg)-1])
			}
			if _, dup := cc[name]; !dup {
				cc[name] = arg
			}
		}
	}
	return cc
}

// nextMember splits off the first comma-separated member of a field
// value, keeping commas inside quoted strings.
func nextMember(s string) (member, rest string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				return s[:i], s[i+1:]
			}
		}
	}
	return s, ""
}

func unquote(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (cc cacheControl) has(name string) bool {
	_, ok := cc[name]
	return ok
}

// seconds returns the delta-seconds argument of name (RFC 9111 §1.2.2):
// a value too large to represent is the largest one; a missing or invalid
// argument is not a value.
func (cc cacheControl) seconds(name string) (time.Duration, bool) {
	arg, ok := cc[name]
	if !ok {
		return 0, false
	}
	return deltaSeconds(arg)
}

// deltaSeconds parses delta-seconds (RFC 9111 §1.2.2): one or more
// digits; a value too large to represent is the largest one.
func deltaSeconds(s string) (time.Duration, bool) {
	if s == "" {
		return 0, false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxDeltaSeconds {
		n = maxDeltaSeconds // §1.2.2: overflow means 2^31 or more
	}
	return time.Duration(n) * time.Second, true
}

// maxDeltaSeconds is the largest delta-seconds value kept, 2^31 (§1.2.2).
const maxDeltaSeconds = 1 << 31

// fields returns the field names given as the argument of a qualified
// no-cache or private directive, canonicalised; nil for the unqualified
// form.
func (cc cacheControl) fields(name string) []string {
	arg := cc[name]
	if arg == "" {
		return nil
	}
	var out []string
	for f := range strings.SplitSeq(arg, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, http.CanonicalHeaderKey(f))
		}
	}
	return out
}

// hopByHop are the header fields that describe one connection, never
// stored nor forwarded (RFC 9110 §7.6.1), besides those the Connection
// field names.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// stripHopByHop deletes from h the hop-by-hop fields and those that its
// Connection field names.
func stripHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, f := range hopByHop {
		h.Del(f)
	}
}

// defaultCacheable are the status codes that are heuristically cacheable
// (RFC 9110 §15.1). 206 is left out: herdhttp stores only full responses.
var defaultCacheable = map[int]bool{
	200: true, 203: true, 204: true, 300: true, 301: true, 308: true,
	404: true, 405: true, 410: true, 414: true, 501: true,
}

// understood are the final status codes herdhttp stores when the response
// says how long it is fresh: the default-cacheable ones and the other
// 2xx to 5xx codes of RFC 9110 whose semantics a cache need not know more
// of to reuse them. 206 and 304 are never stored as such.
func understood(code int) bool {
	return code >= 200 && code < 600 && code != 206 && code != 304 && code != 101
}

// knownStatus reports whether code is one whose caching requirements
// herdhttp knows (the final codes of RFC 9110 §15, 206 and 304 aside):
// a response with must-understand is stored only then, and its no-store
// is then ignored (RFC 9111 §5.2.2.3).
func knownStatus(code int) bool {
	switch {
	case code >= 200 && code <= 205, code >= 300 && code <= 303, code == 307, code == 308,
		code >= 400 && code <= 417, code == 421, code == 422, code == 426, code >= 500 && code <= 505:
		return true
	}
	return false
}

// errorStatus reports whether an origin's answer lets a stale response be
// served under stale-if-error (RFC 5861 §4).
func errorStatus(code int) bool {
	return code == 500 || code == 502 || code == 503 || code == 504
}
