package herdhttp

import (
	"encoding/binary"
	"errors"
	"math"
	"net/http"
	"time"
)

// kind says what an entry is.
type kind uint8

const (
	// kindResponse is a stored response.
	kindResponse kind = 1
	// kindPass marks a key hit-for-pass: its requests go to the origin,
	// uncollapsed, until the mark expires.
	kindPass kind = 2
	// kindIndex says that the responses of a URL vary on varyNames: they
	// are stored under the variant keys of the request values of those
	// fields.
	kindIndex kind = 3
)

// Entry flags.
const (
	// flagMustRevalidate: must-revalidate or proxy-revalidate; a stale
	// response is never served without a successful validation.
	flagMustRevalidate uint8 = 1 << iota
	// flagNoCache: an unqualified no-cache; every reuse is validated first.
	flagNoCache
)

// entry is what herdhttp stores under a key: a response, a hit-for-pass
// mark or a Vary index. An entry is never modified once it is handed to
// the cache: it is served by many requests at once.
type entry struct {
	kind  kind
	flags uint8

	status int
	header http.Header // stored fields: no hop-by-hop ones, none the response kept from storage
	body   []byte

	// The times of RFC 9111 §4.2.3, in Unix nanoseconds on the clock of
	// the replica that made the request: reqTime when it was sent,
	// respTime when the response was received; dateValue is the Date
	// field and ageValue the Age field the origin sent (0 when none).
	reqTime, respTime, dateValue int64
	ageValue                     time.Duration

	// lifetime is the freshness lifetime (§4.2.1); swr and sie the
	// stale-while-revalidate and stale-if-error windows after it (RFC
	// 5861); keep how long past its freshness a response with a validator
	// is kept to be revalidated.
	lifetime, swr, sie, keep time.Duration

	// varyNames are the canonical names of the request fields the response
	// varies on, sorted; varyValues their normalised values in the request
	// that the response answered (for a response), one per name.
	varyNames, varyValues []string

	// reason says why a key is hit-for-pass.
	reason string

	// hit holds the values a hit on a response adds (nil: none are
	// kept); set when the entry is made, before it is shared.
	hit *hitMemo

	// herdSoft is when the cache's storage of this entry was set to end,
	// in Unix nanoseconds; nothing is decided by it.
	herdSoft int64
}

// currentAge is the entry's age at now (see currentAge).
func (e *entry) currentAge(now int64) time.Duration {
	return currentAge(e.dateValue, e.ageValue, e.reqTime, e.respTime, now)
}

// sat keeps a time sum that wrapped from going negative.
func sat(v int64) int64 {
	if v < 0 {
		return math.MaxInt64
	}
	return v
}

// ttl is how long the response stays fresh at now; negative once it is
// stale (by how long).
func (e *entry) ttl(now int64) time.Duration {
	return e.lifetime - e.currentAge(now)
}

func (e *entry) validator() bool {
	return e.header.Get("ETag") != "" || e.header.Get("Last-Modified") != ""
}

// weight is the entry's size in the local tier, in bytes, roughly.
func (e *entry) weight(key string) uint32 {
	n := 160 + len(key) + len(e.body) + len(e.reason)
	for k, vs := range e.header {
		n += len(k) + 16
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	for i := range e.varyNames {
		n += len(e.varyNames[i]) + 16
	}
	for i := range e.varyValues {
		n += len(e.varyValues[i]) + 16
	}
	return uint32(min(n, math.MaxUint32))
}

// The stored form of an entry: a version byte, then the fields in order,
// integers as varints, strings and byte slices as a uvarint length and the
// bytes, a header as the number of fields and, for each, its name and
// values.
const entryVersion = 1

// Decoding limits: a stored entry claiming more is corrupt.
const (
	maxFields = 1 << 12
	maxValues = 1 << 12
)

var errCorrupt = errors.New("herdhttp: corrupt entry")

// codec is the herd.Codec of entries.
type codec struct{}

func (codec) Marshal(e *entry) ([]byte, error) { return encodeEntry(e), nil }

func (codec) Unmarshal(b []byte) (*entry, error) { return decodeEntry(b) }

func encodeEntry(e *entry) []byte {
	b := make([]byte, 0, 128+len(e.body))
	b = append(b, entryVersion, byte(e.kind), e.flags)
	b = binary.AppendVarint(b, int64(e.status))
	b = binary.AppendUvarint(b, uint64(len(e.header)))
	for k, vs := range e.header {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	b = appendString(b, string(e.body))
	for _, v := range []int64{e.reqTime, e.respTime, e.dateValue, int64(e.ageValue),
		int64(e.lifetime), int64(e.swr), int64(e.sie), int64(e.keep), e.herdSoft} {
		b = binary.AppendVarint(b, v)
	}
	b = appendStrings(b, e.varyNames)
	b = appendStrings(b, e.varyValues)
	b = appendString(b, e.reason)
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

// decodeEntry decodes what encodeEntry made; anything else is errCorrupt.
// It never panics, and copies nothing it does not need to: the body
// aliases b.
func decodeEntry(b []byte) (*entry, error) {
	d := decoder{b: b}
	if d.byte() != entryVersion {
		return nil, errCorrupt
	}
	e := &entry{kind: kind(d.byte()), flags: d.byte()}
	if e.kind < kindResponse || e.kind > kindIndex {
		return nil, errCorrupt
	}
	if e.kind == kindResponse {
		e.hit = new(hitMemo)
	}
	status := d.varint()
	if status < 0 || status > 999 {
		d.fail()
	}
	e.status = int(status)
	if n := d.count(maxFields); n > 0 {
		e.header = make(http.Header, n)
		for range n {
			k := d.string()
			vs := make([]string, d.count(maxValues))
			for i := range vs {
				vs[i] = d.string()
			}
			if d.bad {
				break
			}
			if _, dup := e.header[k]; dup {
				d.fail()
			}
			e.header[k] = vs
		}
	}
	e.body = d.bytes()
	e.reqTime, e.respTime, e.dateValue = d.varint(), d.varint(), d.varint()
	e.ageValue = d.duration()
	e.lifetime, e.swr, e.sie, e.keep = d.duration(), d.duration(), d.duration(), d.duration()
	e.herdSoft = d.varint()
	e.varyNames = d.strings()
	e.varyValues = d.strings()
	e.reason = d.string()
	if d.bad || len(d.b) != 0 || e.kind == kindResponse && len(e.varyValues) != len(e.varyNames) {
		return nil, errCorrupt
	}
	if e.header == nil {
		e.header = http.Header{}
	}
	return e, nil
}

// decoder reads an encoded entry; after the first error every read
// returns zero and bad stays set.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) fail() { d.bad, d.b = true, nil }

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// duration reads a non-negative duration.
func (d *decoder) duration() time.Duration {
	v := d.varint()
	if v < 0 {
		d.fail()
		return 0
	}
	return time.Duration(v)
}

// count reads a length of at most limit that the rest of the input can
// hold, one byte per element at least.
func (d *decoder) count(limit int) int {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(limit) || v > uint64(len(d.b)-n) {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return int(v)
}

func (d *decoder) bytes() []byte {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > uint64(len(d.b)-n) {
		d.fail()
		return nil
	}
	out := d.b[n : n+int(v) : n+int(v)]
	d.b = d.b[n+int(v):]
	return out
}

func (d *decoder) string() string { return string(d.bytes()) }

func (d *decoder) strings() []string {
	n := d.count(maxValues)
	if n == 0 {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = d.string()
	}
	return out
}
