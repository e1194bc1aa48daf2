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
//	[34:]    HeaderSize     value
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

	// KnownFlags holds every flag bit this version defines; they are the
	// low bits, so KnownFlags+1 is a power of two.
	KnownFlags = FlagNegative
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
	}
	return nil
}

// Append appends the encoding of e to dst and returns the extended slice. It
// does not check e: an envelope that Validate rejects encodes to bytes that
// Decode rejects.
func Append(dst []byte, e *Envelope) []byte {
	if n := HeaderSize + len(e.Value); cap(dst)-len(dst) < n {
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
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	e.Value = b[HeaderSize:len(b):len(b)]
	return e, nil
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
