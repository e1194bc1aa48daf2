package herd

import (
	"fmt"
	"hash/fnv"
	"strings"
)

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
	n := len(s)
	for i := 0; i < len(s); i++ {
		if s[i] == keySep || s[i] == keyEscape {
			n++
		}
	}
	return n
}

// writeEscaped writes s with a keyEscape before every keySep and keyEscape.
func writeEscaped(b *strings.Builder, s string) {
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == keySep || c == keyEscape {
			b.WriteString(s[start:i])
			b.WriteByte(keyEscape)
			start = i // the byte itself is written with the next run
		}
	}
	b.WriteString(s[start:])
}

// RedactKey returns key's namespace and a short hash of the whole key, for
// logs and metrics that must not show the parts of a key (they may hold
// personal data): RedactKey(Key("users", "tenant-7", "42")) is
// "users#" followed by eight hex digits. Keys not made by [Key] are treated as
// a namespace alone.
func RedactKey(key string) string {
	ns := key
	for i := 0; i < len(key); i++ {
		if key[i] == keyEscape {
			i++
			continue
		}
		if key[i] == keySep {
			ns = key[:i]
			break
		}
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return fmt.Sprintf("%s#%08x", ns, h.Sum32())
}

// SplitKey returns the namespace and parts that [Key] made key from, so that
// a keyed loader ([Options.Load]) can read them back:
// SplitKey(Key("users", "tenant-7", "42")) is "users", ["tenant-7" "42"], and
// a key with no '|' has no parts (nil). A key that Key cannot return (a '\'
// not followed by '|' or '\') is an error.
func SplitKey(key string) (namespace string, parts []string, err error) {
	var (
		fields []string
		b      strings.Builder
	)
	b.Grow(len(key))
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case keyEscape:
			if i+1 == len(key) || key[i+1] != keySep && key[i+1] != keyEscape {
				return "", nil, fmt.Errorf("herd: split key %q: the %q at byte %d escapes nothing", key, keyEscape, i)
			}
			i++
			b.WriteByte(key[i])
		case keySep:
			fields = append(fields, b.String())
			b.Reset()
		default:
			b.WriteByte(c)
		}
	}
	if fields == nil {
		return b.String(), nil, nil
	}
	return fields[0], append(fields[1:], b.String()), nil
}
