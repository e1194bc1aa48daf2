package herd

import "strings"

// Bytes with a meaning in an encoded key. Every other byte stands for itself.
const (
	keySep    = '|'  // ends the namespace and each part but the last
	keyEscape = '\\' // makes the byte after it literal
)

// Key returns the cache key for namespace and parts: the namespace, then each
// part after a '|', with every '|' and '\' inside them preceded by a '\'.
// Key("users", "tenant-7", "42") is "users|tenant-7|42".
//
// A key must hold every input that changes the response, tenant and auth
// scope included: two requests that may be answered differently must never
// share a key, or one caller is served another's data.
//
// Key is injective: two different (namespace, parts) lists never give the same
// key, whatever bytes they hold (separators, escapes, empty parts, invalid
// UTF-8). Reading a key left to right, a '\' and the byte after it are one
// literal byte, a lone '|' ends a field, and any other byte is literal, so the
// key determines its fields; the number of lone '|' is the number of parts, so
// Key("a") and Key("a", "") differ. No Unicode normalisation is done: parts
// that differ in bytes give different keys.
func Key(namespace string, parts ...string) string {
	var b strings.Builder
	b.Grow(keyLen(namespace, parts))
	writeEscaped(&b, namespace)
	for _, p := range parts {
		b.WriteByte(keySep)
		writeEscaped(&b, p)
	}
	return b.String()
}

// keyLen is the length of Key(namespace, parts...).
func keyLen(namespace string, parts []string) int {
	n := escapedLen(namespace) + len(parts)
	for _, p := range parts {
		n += escapedLen(p)
	}
	return n
}

// escapedLen is the length of s once writeEscaped has escaped it.
func escapedLen(s string) int {
	return len(s) + strings.Count(s, string(keySep)) + strings.Count(s, string(keyEscape))
}

// writeEscaped writes s with a keyEscape before every keySep and keyEscape.
func writeEscaped(b *strings.Builder, s string) {
	for {
		i := strings.IndexAny(s, string(keySep)+string(keyEscape))
		if i < 0 {
			b.WriteString(s)
			return
		}
		b.WriteString(s[:i])
		b.WriteByte(keyEscape)
		b.WriteByte(s[i])
		s = s[i+1:]
	}
}
