// Package keyspace names the Redis keys and the pub/sub channel of one cache.
//
// It is the key layout redisstore writes; a Store for another Redis-protocol
// server (Valkey, DragonflyDB) that uses it reads and writes the same keys,
// so replicas running either Store share one cache.
package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// TagLen is the length of a hash tag: 16 lowercase hex digits.
const TagLen = 16

// Space names the Redis keys under one prefix. The zero Space has the empty
// prefix.
type Space struct {
	// prefix holds no '{' or '}', so the first '{' of every name opens the tag.
	prefix string
}

// New returns the Space whose names start with prefix. The prefix must not
// hold '{' or '}'. An empty prefix is allowed; callers choose the default
// ("herd:" in the cache's options).
func New(prefix string) (Space, error) {
	if i := strings.IndexAny(prefix, "{}"); i >= 0 {
		return Space{}, fmt.Errorf("keyspace: prefix %q holds %q at byte %d; braces would change the Redis Cluster hash tag", prefix, prefix[i], i)
	}
	return Space{prefix: prefix}, nil
}

// Prefix returns the prefix s was made with.
func (s Space) Prefix() string { return s.prefix }

// Names are the Redis keys that hold one encoded cache key's remote state.
// All three share one Redis Cluster hash slot, whatever bytes the key holds.
type Names struct {
	// Tag is the key's hash tag: the first 8 bytes of the SHA-256 of the
	// encoded key, as TagLen lowercase hex digits.
	Tag string
	// Value holds the envelope: <prefix>{<tag>}:<key>:v.
	Value string
	// Lease holds the lease token: <prefix>{<tag>}:<key>:l.
	Lease string
	// Fence holds the fence counter: <prefix>{<tag>}:<key>:f.
	Fence string
}

// Names returns the Redis keys for key, an encoded cache key, in generation
// 0; key may hold any bytes, braces included. Redis Cluster hashes only the
// text between the first '{' and the next '}': the prefix has no brace and
// the tag is hex, so that text is the tag in all three names. The key
// itself stays in each name, so different keys never share a name even
// when their tags collide.
func (s Space) Names(key string) Names { return s.NamesAt(key, 0) }

// NamesAt returns the Redis keys for key in generation gen. Generation 0
// has Names' layout; a later one marks each name after its tag, as
// <prefix>{<tag>}#<gen>:<key>:v, so that the names of two generations never
// meet and share the key's slot.
func (s Space) NamesAt(key string, gen uint64) Names {
	sum := sha256.Sum256([]byte(key))
	var tag [TagLen]byte
	hex.Encode(tag[:], sum[:TagLen/2])
	var mark []byte
	if gen > 0 {
		mark = strconv.AppendUint([]byte{'#'}, gen, 10)
	}

	// One allocation holds the three names back to back.
	n := len(s.prefix) + 1 + TagLen + 1 + len(mark) + 1 + len(key) + 2
	var b strings.Builder
	b.Grow(3 * n)
	for _, suffix := range [...]string{":v", ":l", ":f"} {
		b.WriteString(s.prefix)
		b.WriteByte('{')
		b.Write(tag[:])
		b.WriteByte('}')
		b.Write(mark)
		b.WriteByte(':')
		b.WriteString(key)
		b.WriteString(suffix)
	}
	all := b.String()
	tagAt := len(s.prefix) + 1
	return Names{
		Tag:   all[tagAt : tagAt+TagLen],
		Value: all[:n],
		Lease: all[n : 2*n],
		Fence: all[2*n:],
	}
}

// TagName returns the Redis key that holds tag's version:
// <prefix>{<hash>}:<tag>:t, with the hash made as a key's tag is but from
// the tag's bytes after a zero byte, so that tag versions spread over the
// slots apart from the keys; no name of Names ends in ":t".
func (s Space) TagName(tag string) string {
	sum := sha256.Sum256(append([]byte{0}, tag...))
	var h [TagLen]byte
	hex.Encode(h[:], sum[:TagLen/2])
	return s.prefix + "{" + string(h[:]) + "}:" + tag + ":t"
}

// Generation returns the Redis key that holds the generation of the whole
// keyspace: <prefix>{gen}. No name of Names has "gen" for its tag.
func (s Space) Generation() string { return s.prefix + "{gen}" }

// Channel returns the pub/sub channel that announces completions and
// invalidations: <prefix>events. Channels are not hashed to slots by classic
// PUBLISH, so the name needs no tag.
func (s Space) Channel() string { return s.prefix + "events" }

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot returns the Redis Cluster hash slot of the key name: CRC16 (XMODEM) mod
// 16384 of the hash tag — the text between the first '{' and the first '}'
// after it — when that text is non-empty, else of the whole name.
func Slot(name string) uint16 {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		if j := strings.IndexByte(name[i+1:], '}'); j > 0 {
			name = name[i+1 : i+1+j]
		}
	}
	return crc16(name) % Slots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0, no reflection),
// the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
