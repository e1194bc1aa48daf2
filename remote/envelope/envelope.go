// Package envelope encodes the entries of the remote tier: a fixed big-endian
// header that Lua scripts read with string.byte, then the value bytes.
//
// Layout (byte offsets; Lua's string.byte counts from offset+1):
//
//	[0]      VersionOffset  format version, 1
//	[1]      FlagsOffset    Flags
//	[2:10]   SoftOffset     soft expiry, Unix milliseconds, int64, in [0, MaxExpiry]
//	[10:18]  HardOffset     hard expiry, Unix milliseconds, int64, in [soft, MaxExpiry]
//	[18:26]  DeltaOffset    recompute duration, nanoseconds, int64, ≥ 0
//	[26:34]  FenceOffset    fence, uint64, < 2^53
//	[34:]    HeaderSize     value, or, with FlagTagged, the tags and then
//	                        the value: since and the number of tags as
//	                        uvarints, then each tag as a uvarint length and
//	                        its bytes
//
// The fence is below 2^53, and so are the expiries (MaxExpiry < 2^44), so a
// script reads them exactly into Lua numbers (doubles).
package envelope

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// Version is the format version that Append writes and Decode reads.
const Version = 1

// Offsets of the header fields, and the header's size.
const (
	VersionOffset = 0
	FlagsOffset   = 1
	SoftOffset    = 2
	HardOffset    = 10
	DeltaOffset   = 18
	FenceOffset   = 26
	HeaderSize    = 34
)

// MaxFence is the largest fence an envelope can carry: Lua numbers are
// doubles, exact up to 2^53.
const MaxFence = 1<<53 - 1

// MaxExpiry is the latest expiry an envelope can carry, in Unix milliseconds:
// 2262-04-11T23:47:16.854Z, the last millisecond whose Unix nanoseconds fit
// an int64, so that a decoded expiry converts to nanoseconds without
// overflow.
const MaxExpiry = math.MaxInt64 / 1_000_000

// Flags are the bits of an envelope's flags byte.
type Flags uint8

const (
	// FlagNegative marks a negative entry: a cached "not found" rather than a
	// value.
	FlagNegative Flags = 1 << 0

	// FlagTagged marks an entry that carries tags, with the version
	// clock's time its load began (Since), after the header.
	FlagTagged Flags = 1 << 1

	// KnownFlags holds every flag bit this version defines; they are the
	// low bits, so KnownFlags+1 is a power of two.
	KnownFlags = FlagNegative | FlagTagged
)

// MaxTags is the most tags an envelope carries, and MaxTagLen the longest
// tag, in bytes.
const (
	MaxTags   = 1024
	MaxTagLen = 4096
)

// Envelope is one decoded remote entry.
type Envelope struct {
	// Flags qualify the entry; zero is an ordinary value.
	Flags Flags
	// Soft is when the entry stops being fresh, in Unix milliseconds; after it
	// the entry may be served stale while one caller refreshes it.
	// 0 ≤ Soft ≤ MaxExpiry.
	Soft int64
	// Hard is when the entry must no longer be served, in Unix milliseconds.
	// Soft ≤ Hard ≤ MaxExpiry.
	Hard int64
	// Delta is how long the value's last load took, measured on a monotonic
	// clock; zero when unknown. Delta ≥ 0.
	Delta time.Duration
	// Fence is the fence the entry was written under; zero before a store
	// sets it. Fence ≤ MaxFence.
	Fence uint64
	// Tags are the entry's tags, at most MaxTags, none longer than
	// MaxTagLen; FlagTagged is set exactly when there is one. Since is when
	// the entry's load began, on the clock of tag versions (Unix
	// microseconds): the entry is retired once any of its tags has a
	// version at or after it.
	Tags  []string
	Since uint64
	// Value is the encoded value; nil and empty are the same. After Decode it
	// aliases the decoded bytes.
	Value []byte
}

var (
	// ErrUnknownVersion reports an envelope whose version byte this package
	// does not read.
	ErrUnknownVersion = errors.New("envelope: unknown version")
	// ErrCorrupt reports bytes that are not a valid envelope of a known
	// version.
	ErrCorrupt = errors.New("envelope: corrupt")
)

// Validate reports why e would not decode, wrapping ErrCorrupt, or nil.
func (e *Envelope) Validate() error {
	switch {
	case e.Flags&^KnownFlags != 0:
		return fmt.Errorf("%w: unknown flag bits %#02x", ErrCorrupt, uint8(e.Flags&^KnownFlags))
	case e.Soft < 0:
		return fmt.Errorf("%w: negative soft expiry %d", ErrCorrupt, e.Soft)
	case e.Hard < e.Soft:
		return fmt.Errorf("%w: hard expiry %d before soft expiry %d", ErrCorrupt, e.Hard, e.Soft)
	case e.Hard > MaxExpiry:
		return fmt.Errorf("%w: hard expiry %d after MaxExpiry %d", ErrCorrupt, e.Hard, int64(MaxExpiry))
	case e.Delta < 0:
		return fmt.Errorf("%w: negative delta %d", ErrCorrupt, int64(e.Delta))
	case e.Fence > MaxFence:
		return fmt.Errorf("%w: fence %d not below 2^53", ErrCorrupt, e.Fence)
	case (e.Flags&FlagTagged != 0) != (len(e.Tags) > 0):
		return fmt.Errorf("%w: FlagTagged is %v with %d tags", ErrCorrupt, e.Flags&FlagTagged != 0, len(e.Tags))
	case len(e.Tags) > MaxTags:
		return fmt.Errorf("%w: %d tags, more than %d", ErrCorrupt, len(e.Tags), MaxTags)
	}
	for _, t := range e.Tags {
		if len(t) > MaxTagLen {
			return fmt.Errorf("%w: a tag of %d bytes, longer than %d", ErrCorrupt, len(t), MaxTagLen)
		}
	}
	return nil
}

// Append appends the encoding of e to dst and returns the extended slice. It
// does not check e: an envelope that Validate rejects encodes to bytes that
// Decode rejects.
func Append(dst []byte, e *Envelope) []byte {
	if n := HeaderSize + tagsSize(e) + len(e.Value); cap(dst)-len(dst) < n {
		// One allocation, growing geometrically when appending repeatedly.
		grown := make([]byte, len(dst), max(len(dst)+n, 2*cap(dst)))
		copy(grown, dst)
		dst = grown
	}
	dst = append(dst, Version, byte(e.Flags))
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Soft))
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Hard))
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.Delta))
	dst = binary.BigEndian.AppendUint64(dst, e.Fence)
	if e.Flags&FlagTagged != 0 {
		dst = binary.AppendUvarint(dst, e.Since)
		dst = binary.AppendUvarint(dst, uint64(len(e.Tags)))
		for _, t := range e.Tags {
			dst = binary.AppendUvarint(dst, uint64(len(t)))
			dst = append(dst, t...)
		}
	}
	return append(dst, e.Value...)
}

// Decode decodes b. The envelope's Value aliases b (capped at its end), so b
// must not change while the envelope is in use. Errors wrap ErrUnknownVersion
// or ErrCorrupt; Decode never panics.
func Decode(b []byte) (Envelope, error) {
	if err := checkHeader(b); err != nil {
		return Envelope{}, err
	}
	e := Envelope{
		Flags: Flags(b[FlagsOffset]),
		Soft:  int64(binary.BigEndian.Uint64(b[SoftOffset:])),
		Hard:  int64(binary.BigEndian.Uint64(b[HardOffset:])),
		Delta: time.Duration(binary.BigEndian.Uint64(b[DeltaOffset:])),
		Fence: binary.BigEndian.Uint64(b[FenceOffset:]),
	}
	if e.Flags&^KnownFlags != 0 {
		return Envelope{}, e.Validate() // unknown flags may change the layout: read no further
	}
	rest := b[HeaderSize:len(b):len(b)]
	if e.Flags&FlagTagged != 0 {
		var err error
		if e.Since, e.Tags, rest, err = decodeTags(rest); err != nil {
			return Envelope{}, err
		}
	}
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	e.Value = rest
	return e, nil
}

// decodeTags reads the tags section of a tagged envelope from b, and
// returns what follows it.
func decodeTags(b []byte) (since uint64, tags []string, rest []byte, err error) {
	corrupt := func(what string) error { return fmt.Errorf("%w: tags section: %s", ErrCorrupt, what) }
	since, n := uvarint(b)
	if n <= 0 {
		return 0, nil, nil, corrupt("since")
	}
	b = b[n:]
	count, n := uvarint(b)
	if n <= 0 || count == 0 || count > MaxTags {
		return 0, nil, nil, corrupt("count")
	}
	b = b[n:]
	tags = make([]string, 0, count)
	for range count {
		l, n := uvarint(b)
		if n <= 0 || l > MaxTagLen || l > uint64(len(b)-n) {
			return 0, nil, nil, corrupt("tag length")
		}
		tags = append(tags, string(b[n:n+int(l)]))
		b = b[n+int(l):]
	}
	return since, tags, b, nil
}

// checkHeader reports whether b starts with a whole header of a known version.
// The version comes first: a later version may have a shorter header.
func checkHeader(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if v := b[VersionOffset]; v != Version {
		return fmt.Errorf("%w %d", ErrUnknownVersion, v)
	}
	if len(b) < HeaderSize {
		return fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrCorrupt, len(b), HeaderSize)
	}
	return nil
}

// SetFence rewrites the fence field of the encoded envelope b in place. It
// fails, changing nothing, if b has no whole header of a known version or
// fence is above MaxFence.
func SetFence(b []byte, fence uint64) error {
	if fence > MaxFence {
		return fmt.Errorf("envelope: fence %d not below 2^53", fence)
	}
	if err := checkHeader(b); err != nil {
		return err
	}
	binary.BigEndian.PutUint64(b[FenceOffset:], fence)
	return nil
}

// tagsSize is the size of e's tags section, at most.
func tagsSize(e *Envelope) int {
	if e.Flags&FlagTagged == 0 {
		return 0
	}
	n := 2 * binary.MaxVarintLen64
	for _, t := range e.Tags {
		n += binary.MaxVarintLen64 + len(t)
	}
	return n
}

// uvarint is binary.Uvarint for the canonical (shortest) encoding only, so
// that every envelope has one encoding; n ≤ 0 means none.
func uvarint(b []byte) (uint64, int) {
	v, n := binary.Uvarint(b)
	if n > 0 && n != len(binary.AppendUvarint(nil, v)) {
		return 0, 0
	}
	return v, n
}
