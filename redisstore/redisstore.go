// Package redisstore keeps a herd cache's remote tier in Redis: envelopes, fenced leases and change notices, on a single node, behind Sentinel or on a Cluster.
//
// Each cache key has up to three Redis keys, which share one Cluster hash
// slot through their hash tag <tag> (16 hex digits: the first 8 bytes of
// the SHA-256 of the key), and each has a TTL, so that Redis holds nothing
// for a key that is no longer used:
//
//	name                     holds                   TTL                                      length
//	<prefix>{<tag>}:<key>:v  the envelope            the hard TTL written, jitter included    34 + value (+ tags)
//	<prefix>{<tag>}:<key>:l  the lease token, hex    the lease's TTL, extended by its holder  32
//	<prefix>{<tag>}:<key>:f  the fence, decimal µs   max(value, lease, 1 min TTL) + 10 s      16
//
// The fence's TTL is set again by every write, Set, Invalidate, Acquire or
// Extend, and none shortens a longer one. Redis 7.0 reports (MEMORY USAGE,
// key "profile|acme|42") 88 bytes for the fence, 136 for the lease and
// about 114 + the envelope's length for the value, rounded up by the
// allocator: 136 for a 1-byte value, 248 for 100 bytes. A cached key so
// takes about 202 bytes plus its envelope (224 for a 1-byte value, 336 for
// 100 bytes), and 136 more while a load holds its lease; each byte of a
// longer key adds a byte to each name. A few keys are shared, not per
// cache key:
//
//	<prefix>{<hash>}:<tag>:t    a tag's version (Tags)          TagKeep (24 h) after its last use  16
//	<prefix>{gen}               the generation (InvalidateAll)  none: one key in all               16
//	<prefix>hot:{hot}:<ms>:<n>  the hot set of one period       three periods                      sorted set
//	<prefix>{live}:s            the heartbeats' sequence        max(1 min, 10 LivePeriods)         decimal
//	<prefix>{live}:g            the heartbeats' gate            half a LivePeriod                  1
//
// Every change runs as one Lua script, so it is atomic. Acquire judges a
// value's freshness by the server's clock (TIME) against the soft expiry a
// replica wrote by its own clock: keep the clocks in sync.
//
// A fence is max(the previous fence + 1, the server's clock in Unix
// microseconds), below 2^53, and a missing fence key reads as fence 0. So
// when a fence key expires or is evicted, the next fence starts again from
// the clock, above every fence handed out before, provided the clock that
// gives the next fence does not read earlier than the one that gave the
// lost fence, less the time in between. A fence key that expired was left
// alone for its TTL, so only a clock stepped back by more than that (over a
// minute) could break it; a fence key evicted or lost in a failover (below)
// may have been given out just before, so keep the servers' clocks in sync
// and never stepped back (NTP slews small corrections). A holder whose
// fence key has gone cannot write: a missing key holds only fence 0.
//
// InvalidateAll ([remote.Clearer]) retires every key with one script on one
// key, <prefix>{gen}, which holds the keyspace's generation: max(the last
// + 1, the server's clock in Unix microseconds). The names of a key in a
// generation past 0 carry it after the tag, <prefix>{<tag>}#<gen>:<key>:v,
// so what earlier generations stored is no longer read and expires at its
// own TTL, and their leases and fences hold nothing in the new one. Each
// Remote reads the generation at New (or at its first call, if Redis could
// not be reached), learns a new one from its notice, and reads it again
// after its subscription reconnects. The generation key has no TTL; a
// Remote that finds none reads generation 0, so keep it from eviction: use
// a volatile-* maxmemory-policy (or noeviction) with InvalidateAll.
//
// Tag versions ([remote.Tagger]) live under <prefix>{<hash>}:<tag>:t, the
// hash made from the tag's bytes, so tags spread over the slots; each is a
// time on the server's clock in Unix microseconds, like a fence, and is
// kept for TagKeep (a day) after its last read or InvalidateTag. A version
// that expired or was evicted reads as the server's clock less TagKeep:
// above the version it replaces, since that one was left unused for
// TagKeep, and below the start of any load that reads it. InvalidateTag is
// one script on one key; the versions of the tags of a batch of values
// are read in pipelines bounded as Batches (below) says.
//
// Change and completion notices go out with classic PUBLISH on
// <prefix>events, or on a Cluster with SPUBLISH on a shard channel (see
// Notices on a Cluster), one message each, whatever bytes the key holds:
//
//	c<fence>:<key>     key written (Write, Set, MarkStale) under fence
//	v<fence>:<length>:<key><envelope>
//	                   key written (Write, WriteRelease, Set) under fence,
//	                   carrying the envelope stored, its fence field set,
//	                   when it is at most NoticeValueMax bytes (1 KiB): the
//	                   replicas that hold an older copy replace it with no
//	                   GET ([remote.Notice] Value); a longer one goes out as
//	                   a c notice, and each replica holding the key reads it
//	                   once
//	x<fence>:<key>     key deleted (Invalidate) under fence
//	d<origin><key>     key's load completed (Release, WriteRelease)
//	b<origin><records> the loads one WriteReleaseMany ended, one record per
//	                   key: w<fence>:<length>:<key> (written under fence,
//	                   then completed) or d<length>:<key> (completed)
//	g<generation>      every key retired (InvalidateAll)
//	t<version>:<tag>   tag's version advanced (InvalidateTag)
//	h<sequence>:<ms>   a heartbeat (LivePeriod), the server's clock in ms
//	l<ms>:<origin><key>
//	                   key's lease taken (Acquire, AcquireMany) for ms,
//	                   handed to SubscribeHolds subscribers alone
//
// where origin is the announcing Remote's id (16 hex digits), length the
// key's length in bytes, and every number a canonical decimal; a message
// that does not parse is ignored whole.
//
// Notices on a Cluster. A Cluster relays each classic PUBLISH from the
// master that ran it to every other node over the cluster bus, so that
// every master pays for every change. A shard channel (SPUBLISH and
// SSUBSCRIBE, Redis 7) lives on the master of its hash slot alone. A
// Remote over a *redis.ClusterClient subscribes, besides <prefix>events,
// to eight shard channels <prefix>events{<tag>}, whose tags put them on
// slots 1024, 3072, … 15360, one connection each to the master that holds
// the slot; a master that holds a range of 2048 slots or more holds one.
// Each key's notices go out on the first shard channel held by the key's
// master, by the client's slot map, from within the script that makes the
// change (a script may publish only to a shard channel of its own
// master): they cross no bus, reach every Remote, and come in order for
// each key, as before. When the map was out of date, so that the channel
// is not on the script's master, the script announces with classic
// PUBLISH instead, as it does for a key whose master holds no shard
// channel, and for notices of no one key (InvalidateAll, InvalidateTag).
// WriteReleaseMany's batch notices go out on the shard channel of each
// master that held some of its keys, side by side. When a shard
// channel's slot moves to another master (a reshard), Redis ends its
// subscriptions; a Remote reloads the slot map and subscribes again on
// the new master, after which its subscribers drop everything, as after
// any reconnection. Tested on a Cluster of three masters: a Set,
// MarkStale, Invalidate, Acquire and WriteRelease of keys on every master
// relay no message over the bus, where with ClassicNotices each of their
// six messages is relayed to both other masters; the slots of a master's
// shard channels moved to another master are heard on again. Set
// Options.ClassicNotices for Clusters older than Redis 7, and while a
// fleet is upgraded from a version that announced with PUBLISH alone.
//
// Batches. The batch calls ([remote.BatchStore], [remote.BatchLease],
// TagVersions, and AddHot in transactions) send their entries, in order,
// in pipelines of GETs (LoadMany) or of one command or script run per key,
// one pipeline after another, each within Timeout, so that a batch of any
// size fits: a pipeline holds at most BatchKeys entries (128 by default)
// and BatchBytes bytes (4 MiB), an entry larger than that alone. The bytes
// count what is sent and, for LoadMany and AcquireMany, whose replies
// carry values, the mean length of the values that the last such pipeline
// read (or half the mean before, if that is more; BatchBytes/BatchKeys,
// 32 KiB, before the first read, and twice the mean after a pipeline that
// timed out). 128 script runs take well under a millisecond of Redis' time
// and a few of the client's, so they fit the default Timeout of 250 ms on
// a loaded machine too (500 did not always, on two busy cores under the
// race detector), and 4 MiB crosses a 1 Gb/s link in about 35 ms. go-redis
// splits each pipeline by master on a Cluster: one round trip to each
// master that holds some of its keys, all at once, MOVED and ASK followed.
// A pipeline that fails fails only its entries. The entries of a pipeline
// that timed out are sent once more, in a pipeline of their own, all but
// acquisitions (AcquireMany), whose leases, which they may have taken, are
// released and announced instead. The runs that a server answers with
// NOSCRIPT (after a restart, a failover or SCRIPT FLUSH) are sent once
// more, after the script is loaded on every master. Each key's script is
// atomic, the batch is not. WriteReleaseMany's scripts announce nothing:
// once a pipeline has returned, its keys' changes and completions are
// published in batch notices of at most 256 keys and 32 KiB each (one
// PUBLISH, or one pipeline of them; on a Cluster, one SPUBLISH or more
// on each master's shard channel), so the notices of each pipeline
// follow all of its writes, and a subscriber queues each batch notice as
// one message.
//
// Refused writes. A write-back (WriteRelease, WriteReleaseMany) whose SET
// Redis refuses inside the script (OOM: maxmemory reached under
// maxmemory-policy noeviction) still drops the lease and announces the
// completion, and returns an error wrapping [ErrWriteFailed]: the scripts
// carry no shebang flags, so Redis 7 lets them run when full and refuses
// only their first write of a kind that takes memory (SET), which they
// make with redis.pcall; deleting a lease, PUBLISH and SPUBLISH are
// allowed when full. Release works when full. A command that Redis refuses before
// running it (a value longer than proto-max-bulk-len, after which Redis
// drops the connection) runs nothing of its script: WriteRelease returns
// the error and leaves the release to its caller, while WriteReleaseMany
// releases each entry whose script failed once more with the release
// script.
//
// The fleet's hot set ([remote.HotSet]) is one sorted set per period,
// <prefix>hot:{hot}:<period ms>:<number>, numbered by the replicas' clocks,
// trimmed to the keys read most and kept for three periods; all share one
// hash slot.
// Acquire treats a stored value that Go's decoder would refuse (an unknown
// header, expiries out of order or past 2262-04-11, a fence at or above
// 2^53) as absent, so it is reloaded once, under the fence. An error reply
// about one key's state (a fence key that holds no fence, a key of another
// type) wraps [remote.ErrRejected], which the cache's breaker does not count.
//
// Redis settings. Any maxmemory-policy works: an evicted value is a miss,
// reloaded under the fence; an evicted lease may cost a second load beside
// the first, whose write is then refused; an evicted fence key restarts
// from the clock, so an older holder's write is refused, as above. (Under
// noeviction, a full Redis refuses writes instead; see Refused writes.)
//
// A Cluster in motion. go-redis reloads a ClusterClient's slot map only
// after a MOVED or ASK reply, or once a minute, so after a master dies its
// clients would keep dialling the dead address for up to a minute, though
// the Cluster promoted a replica within cluster-node-timeout and a second.
// A Remote over a *redis.ClusterClient has the map reloaded (ReloadState,
// in the background) after a call fails with a connection error, a
// timeout, or a CLUSTERDOWN, MOVED, ASK, TRYAGAIN or READONLY reply, at
// most once per 250 ms. Each of its notice subscriptions, which lives on
// the master of its channel's slot, is received in a loop that, after a
// failed receive, reloads the map and receives again (which resubscribes)
// after a pause growing from 10 to 250 ms; a quiet subscription is pinged
// every 3 s. Tested on a Cluster of three masters and their replicas
// (cluster-node-timeout 1 s) with a SIGKILL of the master of the channel's
// slot, and of shard channels, under the reads of four caches: the calls
// stop failing about 0.4 s after the promotion, and the notices of the
// dead master's keys come back in about 0.5 s.
//
// While a slot migrates (CLUSTER SETSLOT MIGRATING on its master,
// IMPORTING on the target, then MIGRATE of its keys), Redis runs a
// command on several keys of the slot only on a node that holds them all,
// and answers TRYAGAIN otherwise; go-redis follows the ASK to the target
// and retries TRYAGAIN three times. A key's lease key is absent while no
// load runs, so its multi-key scripts would fail for the whole migration.
// The calls whose scripts meet TRYAGAIN then fall back to one-key steps,
// each sent to the node that holds its key (the target, once the source
// no longer does): Acquire (and AcquireMany's entries) reads a fresh
// value, else takes the lease with SET NX PX or reports the holder's,
// then advances the fence and announces the hold as the script does (a
// PUBLISH of its own), so that other replicas still make no attempt
// while it runs (tested with two caches, each with its own client and
// subscription); Set, Invalidate and MarkStale advance the
// fence, then store, delete or mark the value under the new fence unless
// the stored one carries a newer fence; Write, WriteRelease (and
// WriteReleaseMany's entries) read the fence key, store the value unless
// the stored one carries a newer fence, read the fence key again, and
// release. The fleet's acquisitions meet on one lease key, so the
// migration keeps one load per key per expiry (tested with four caches
// through MIGRATING, MIGRATE and SETSLOT NODE). The steps are not atomic
// together, but a write-back that finds, on its second read, that the
// fence moved since its first deletes the value it stored unless a newer
// one replaced it, and reports no write, so a change that lands between a
// write-back's read and its store (an Invalidate that deleted the old
// value) is not undone. With AckReplicas, each step waits for the
// replicas of the master that ran it, and a change that a master answers
// with ASK is sent, after ASKING, with its WAIT to the master that ASK
// names. Extend and ExtendMany's entries, which have no such steps, run
// again after TRYAGAIN, up to five times in all with pauses doubling from
// 10 ms, within Timeout, and then fail with an error wrapping
// [ErrSlotMigrating] and [remote.ErrRejected], which the cache's breaker
// does not count; the lease then lapses, as under any failed extension.
// AcquireMany's entries that fall back carry no Stale value.
//
// Readiness. New does not fail when Redis cannot be reached: it waits up
// to Timeout for the subscription and returns a Remote whose calls fail
// until Redis answers. Ping is the readiness check (every master of a
// Cluster answers PING within Timeout); Reached reports, without a call,
// whether the Remote has had an answer since New. A herd cache made over
// a Remote that has not reached Redis starts with its breaker open and a
// probe due: its first remote call probes Redis, and the Gets meanwhile
// serve from memory and load once per replica instead of each waiting
// for Timeout; while Redis stays down, one probe per BreakerCooldown
// tries it. The recipe: New, then Ping before the replica takes traffic,
// then herd.New; when Ping fails, fail the readiness probe, or go on
// degraded. go-redis logs each failed dial through its own logger, which
// redis.SetLogger silences or redirects.
//
// Limits. Replication is asynchronous: a failover to a replica that had not
// received the latest writes, or a restart without persistence, loses them,
// and readers may see an older value than a notice announced. The lost
// fences do not come back: the next fence comes from the clock, under the
// assumption above. Run Redis with persistence (appendonly yes) where lost
// writes matter; min-replicas-to-write narrows the failover window but does
// not close it; with Options.AckReplicas (below), a failover to a replica
// that acknowledged them keeps the changes that returned. Notices can be
// lost (a dropped connection, a slow subscriber): once the subscription
// reconnects, subscribers are told to drop everything and Wait-ers wake
// to re-read, and twice the cache's NearTTL bounds the staleness in
// between (with LivePeriod P, 2P + 2×NearTTL; see A live channel).
//
// A live channel. Redis delivers the messages of one connection's
// subscription in the order they were published, and loses them only with
// the connection: so a heartbeat published after a change proves, to a
// subscriber that hears it, that the change's notice came before it. With
// Options.LivePeriod P set, each Remote waits P and a random part of P/2
// after the last heartbeat it heard or sent, then runs one script that
// publishes the next one unless another was published less than P/2 ago
// (a key with that TTL is the gate): the fleet sends about one heartbeat
// per P, whatever its size, each one script run (about 1 round trip per P
// for the fleet). The script numbers the heartbeats (INCR) and stamps each
// with the server's clock. A subscriber that hears heartbeat n+1 after n
// hands its SubscribeLive subscribers a proof good until the heartbeat's
// time plus 2P, in order with the notices; a gap in the numbers (a
// heartbeat lost, or the sequence key lost in a failover) and a
// reconnection hand them the zero Notice (drop everything) first. A
// frozen subscription, or one whose connection died unseen, hears no
// heartbeat, and the last proof runs out. A herd cache over it trusts its
// local copies while a proof holds, and re-reads them each NearTTL
// otherwise, so its staleness after a lost notice is bounded by
// max(2P + NearTTL, 2×NearTTL) from the change, at most 2P + 2×NearTTL,
// and by the notice's own delay while none is lost; keep the clocks of
// the servers and the replicas in sync, as for fences. Tested with a relay
// that stops forwarding to one replica's subscription, and with CLIENT
// KILL of the subscriptions. A Cluster propagates classic PUBLISH over
// its bus, where a message can be lost without a subscriber's connection
// breaking and messages published on different masters arrive in no
// fixed order, and a key's notices fall back to it while slot maps are
// out of date (see Notices on a Cluster), so no heartbeat proves anything
// there: LivePeriod is ignored on a Cluster, whose caches re-read each
// NearTTL, so that a lost notice is made good within 2×NearTTL (tested
// with a relay in front of every node that stops forwarding to one
// replica's subscriptions).
//
// Why not Redis' own client-side caching. RESP3 CLIENT TRACKING has Redis
// push an invalidation for each key a client read. rueidis builds its
// client on it; go-redis added it late and marks it experimental (v9.23's
// ClientSideCacheConfig: the API may change in a minor release, DB 0
// only, off with credential providers, an invalidation applied when the
// client next reads the connection that carries it, and MaxStaleness as
// the bound when one is late). It caches command replies, not herd's
// decoded values: a herd replica would still keep its own tier, and an
// invalidation tells it that a key was touched, not whether the change is
// newer than its copy (no fence), nor anything of leases, completions,
// tags or InvalidateAll, which herd's channel carries already, in one
// ordered stream. A tracking connection that breaks loses invalidations
// as a subscription does, and broadcast mode sends every change to every
// replica as herd's notices do. So this package extends its own channel:
// a heartbeat costs the fleet one script run per period and proves every
// kind of notice complete, on any go-redis version it supports.
//
// Acknowledged changes. With Options.AckReplicas set, each change a cache
// makes (Set, Invalidate, MarkStale, InvalidateTag, InvalidateAll) is
// sent in one pipeline with WAIT <AckReplicas> <AckTimeout> after it, on
// one connection to the master of its key's slot, and returns once that
// many replicas have acknowledged it, or else, after AckTimeout, with an
// error wrapping [ErrNotAcknowledged]. The master has made and announced
// the change all the same, and keeps it unless it fails over or restarts;
// the cache drops its own copy of the key, and its breaker counts the
// error as Redis trouble. Each change is idempotent in effect: to have it
// kept, do it again. Redis replicates in order, so a change that returned
// is held, with every change before it, by AckReplicas replicas; a
// failover that promotes one of them keeps it, and no later read brings
// back what it retired. Tested with a Sentinel group (one master, one
// replica, three Sentinels) under SENTINEL FAILOVER and a SIGKILL of the
// master, with Set and Invalidate under load.
//
// What it does not promise. An acknowledgement means the replica holds
// the change in memory, not on disk: a replica that acknowledged and then
// fails with the master loses it, as does a whole group restarted without
// persistence. Sentinel promotes the replica it ranks first (replica-
// priority, then the replication offset it last saw), which with more
// replicas than AckReplicas may be one that did not acknowledge; with
// AckReplicas equal to the number of replicas that gap closes, and one
// replica down fails every change. A change that returned the error may
// or may not survive a failover. Write-backs of loaded values and lease
// acquisitions do not wait: a write-back lost in a failover costs a
// reload, and the key falls back to its state after the changes that
// returned, none of which it undoes; a lost fence is replaced by one from
// the clock, as above. min-replicas-to-write on the master is
// complementary: it refuses writes while too few replicas are connected,
// where WAIT reports them afterwards.
//
// On a Cluster, a change and its WAIT go to the master that go-redis'
// slot map names for the key's slot (hooks added to the ClusterClient
// itself do not see them; those added to its nodes' clients do), and
// WAIT counts that master's replicas. A change that meets MOVED or ASK
// (its slot moved, by a failover or a resharding) fails with that reply,
// having changed nothing, and go-redis reloads its slot map for the next
// one. AckTimeout adds to each change's deadline (Timeout) and must fit
// in the Client's ReadTimeout.
package redisstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/keyspace"
	"github.com/herdcache/herd/remote/notify"
)

// Defaults of Options.
const (
	DefaultPrefix     = "herd:"
	DefaultTimeout    = 250 * time.Millisecond
	DefaultBatchKeys  = 128
	DefaultBatchBytes = 4 << 20
)

// Fence key TTLs: a fence key lives max(the value's ttl, the lease's ttl,
// minFenceTTL) + fenceMargin after each change to its key.
const (
	minFenceTTL = time.Minute
	fenceMargin = 10 * time.Second
)

// subscribeQueue is how many messages a subscription queues for a slow fn
// (a message from the channel being one notice, or up to noticeRecords of
// a batch) before it replaces them with one zero Notice: drop everything.
const subscribeQueue = 1024

// ErrClosed is returned, wrapped, by calls on a Remote after Close.
var ErrClosed = errors.New("redisstore: closed")

// Options configures a Remote.
type Options struct {
	// Client talks to Redis: a single node (*redis.Client), a Sentinel-backed
	// failover client, or a Cluster (*redis.ClusterClient). It is required,
	// and must honour context deadlines on the socket (ContextTimeoutEnabled,
	// which [NewClient] sets): New checks it for *redis.Client and
	// *redis.ClusterClient and trusts any other UniversalClient to do so. A
	// *redis.Ring is refused: its shards do not share pub/sub, so notices
	// would be lost. The Remote never closes the Client.
	Client redis.UniversalClient
	// Prefix starts every Redis key and the channel name, so that several
	// caches can share one Redis. Empty means DefaultPrefix ("herd:"). It
	// must hold no '{' or '}': those would change the Cluster hash slot.
	Prefix string
	// Timeout is the deadline of each Redis call, within the caller's own.
	// Zero means DefaultTimeout (250ms); it must not be negative.
	Timeout time.Duration
	// BatchKeys bounds the keys of each pipeline that a batch call sends
	// (see "Batches" in the package doc), so that each fits in Timeout.
	// Zero means DefaultBatchKeys (128); it must not be negative.
	BatchKeys int
	// BatchBytes bounds the bytes of each pipeline that a batch call sends
	// and, as estimated from the values read before, of its replies; a
	// single larger entry goes alone. Zero means DefaultBatchBytes (4 MiB);
	// it must not be negative.
	BatchBytes int
	// AckReplicas, when positive, makes every change (Set, Invalidate,
	// MarkStale, InvalidateTag, InvalidateAll) wait, with Redis' WAIT,
	// until that many replicas of its master have acknowledged it, and fail
	// with an error wrapping ErrNotAcknowledged when fewer have within
	// AckTimeout; write-backs of loaded values do not wait. See
	// "Acknowledged changes" in the package doc for what it promises. It
	// needs a *redis.Client or a *redis.ClusterClient. Zero means changes
	// return once the master has made them; it must not be negative.
	AckReplicas int
	// AckTimeout bounds each change's wait for its replicas, on top of
	// Timeout; it is rounded up to whole milliseconds, and the Client's
	// ReadTimeout must be at least AckTimeout plus Timeout. Zero means
	// DefaultAckTimeout (250ms) when AckReplicas is set; it must be zero
	// when AckReplicas is not, and must not be negative.
	AckTimeout time.Duration
	// LivePeriod, when positive, makes the Remotes on one Redis and prefix
	// take turns to publish a heartbeat on the notice channel about once
	// per LivePeriod, and makes SubscribeLive hand its subscribers proofs
	// that no notice was lost, each good for twice the period, so that a
	// cache trusts its local copies past NearTTL while they hold (see "A
	// live channel" in the package doc); DefaultLivePeriod (1s) is the
	// recommended value. Give every Remote of a fleet the same period. It
	// is ignored on a Cluster. Zero means no heartbeats and no proofs; it
	// must not be negative.
	LivePeriod time.Duration
	// ClassicNotices makes a Remote on a Cluster announce every notice
	// with classic PUBLISH, which each master relays to every other node,
	// instead of on shard channels (SPUBLISH), which stay on one master
	// (see "Notices on a Cluster" in the package doc). Shard channels need
	// Redis 7; set it for older Clusters, and while a fleet is upgraded
	// from a version of this package that announced with PUBLISH alone.
	// It is ignored off a Cluster.
	ClassicNotices bool
}

// NewClient returns a client for o, like redis.NewUniversalClient, with
// ContextTimeoutEnabled set so that Redis calls end at their deadlines. It
// does not change o; a nil o means the zero options (one node at
// localhost:6379).
func NewClient(o *redis.UniversalOptions) redis.UniversalClient {
	var c redis.UniversalOptions
	if o != nil {
		c = *o
	}
	c.ContextTimeoutEnabled = true
	return redis.NewUniversalClient(&c)
}

// Remote is a remote tier in Redis. It implements [remote.Store], [remote.Lease],
// [remote.Notifier], [remote.LiveNotifier], [remote.HotSet], [remote.BatchStore] and [remote.BatchLease]
// and is safe for concurrent use. Make it with [New] and stop it with Close.
type Remote struct {
	client  redis.UniversalClient
	space   keyspace.Space
	channel string
	timeout time.Duration
	// batchKeys and batchBytes bound each pipeline of a batch call.
	batchKeys, batchBytes int
	// ackReplicas is how many replicas must acknowledge each change
	// within ackTimeout (see change); zero for none, and ackTimeout zero.
	ackReplicas int
	ackTimeout  time.Duration
	// valueBytes is the mean length of the values that the last pipeline
	// of reads returned (at least 1; batchBytes/batchKeys before the
	// first), by which the next one is sized (see learn).
	valueBytes atomic.Int64
	// id marks the completions this Remote announces (originLen hex digits):
	// Release wakes this Remote's Wait-ers itself, so their echo on the
	// channel is not counted a second time.
	id string

	// shardChannels are the shard channels that carry keys' notices on a
	// Cluster (shard.go); nil off a Cluster or with ClassicNotices.
	shardChannels []string
	// listeners are the subscriptions that feed Subscribe and Wait: to
	// channel, then to each of shardChannels. Each has a listen goroutine
	// that reads it until Close closes it; listening is closed once all
	// of them have returned.
	listeners []*listener
	listening chan struct{}
	// stopListen ends listen's pauses and beat; Close calls it.
	stopListen context.CancelFunc

	// livePeriod is Options.LivePeriod; zero when proofs are off (live.go).
	// beat publishes the heartbeats, waiting longer after each one
	// heardBeat reports, and closes beating (nil when off) as it returns.
	livePeriod time.Duration
	heardBeat  chan struct{}
	beating    chan struct{}

	// cluster is Client when it is a *redis.ClusterClient, else nil; its
	// slot map is reloaded at most once per reloadEvery (see reload), at
	// reloadedAt, the time since born.
	cluster    *redis.ClusterClient
	born       time.Time
	reloadedAt atomic.Int64

	// closed is set by Close, under mu, before it wakes the Wait-ers.
	closed atomic.Bool

	// gen is the newest generation of the keyspace this Remote knows of
	// (InvalidateAll); genKnown is unset until it has read it, and again
	// after the subscription reconnects, when its announcement may have
	// been missed.
	gen      atomic.Uint64
	genKnown atomic.Bool

	// reached is set by the first answer from Redis that shows it up: the
	// subscription's confirmation, the generation read at New, or a Ping.
	reached atomic.Bool

	mu sync.Mutex
	// ready is closed by the first confirmations of the listeners, once all
	// have come, if New is still waiting for them (started unset);
	// unconfirmed counts the listeners that have not confirmed yet.
	ready       chan struct{}
	unconfirmed int
	// started is set when New stops waiting for the first confirmations: a
	// confirmation that comes later may also follow lost notices.
	started bool
	// waits holds the Wait calls blocked until a key's next completion.
	waits notify.Waiters
	// subs holds the subscriptions that have not been stopped, each with
	// whether it gets proofs of liveness (SubscribeLive).
	subs map[*notify.Subscription]bool
	// holds calls the SubscribeHolds subscribers, on the listening
	// goroutine, as it reads each hold announcement.
	holds notify.Direct
	// lastBeat is the sequence number of the last heartbeat heard on the
	// subscription since it was last confirmed; zero for none (live.go).
	lastBeat uint64

	// fenceFloor and fenceMargin are minFenceTTL and fenceMargin, which
	// tests lower to see fence keys expire.
	fenceFloor, fenceMargin time.Duration

	// onWait, when non-nil, is called by Wait once it is registered to be
	// woken; tests set it to know when to announce.
	onWait func(key string)
}

var (
	_ remote.Store         = (*Remote)(nil)
	_ remote.Lease         = (*Remote)(nil)
	_ remote.WriteReleaser = (*Remote)(nil)
	_ remote.Notifier      = (*Remote)(nil)
	_ remote.LiveNotifier  = (*Remote)(nil)
	_ remote.HoldNotifier  = (*Remote)(nil)
)

// New returns a Remote over o.Client and subscribes it to the notice
// channel. It waits up to o.Timeout for the subscription to be confirmed; if
// Redis cannot be reached it returns a working Remote all the same, whose
// calls fail until Redis answers and whose subscription starts once it does
// (see Reached and Ping). Invalid options give an error prefixed
// "redisstore: ".
func New(o Options) (*Remote, error) {
	if err := checkClient(o.Client); err != nil {
		return nil, err
	}
	prefix := o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if i := strings.IndexAny(prefix, "{}"); i >= 0 {
		return nil, fmt.Errorf("redisstore: Prefix %q holds %q at byte %d; braces would change the Redis Cluster hash slot", prefix, prefix[i], i)
	}
	space, err := keyspace.New(prefix)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	timeout := o.Timeout
	switch {
	case timeout < 0:
		return nil, fmt.Errorf("redisstore: Timeout %v is negative", timeout)
	case timeout == 0:
		timeout = DefaultTimeout
	}
	batchKeys, batchBytes := o.BatchKeys, o.BatchBytes
	switch {
	case batchKeys < 0:
		return nil, fmt.Errorf("redisstore: BatchKeys %d is negative", batchKeys)
	case batchBytes < 0:
		return nil, fmt.Errorf("redisstore: BatchBytes %d is negative", batchBytes)
	}
	batchKeys = cmp.Or(batchKeys, DefaultBatchKeys)
	batchBytes = cmp.Or(batchBytes, DefaultBatchBytes)
	ackTimeout, err := checkAck(o, timeout)
	if err != nil {
		return nil, err
	}
	if o.LivePeriod < 0 {
		return nil, fmt.Errorf("redisstore: LivePeriod %v is negative", o.LivePeriod)
	}

	r := &Remote{
		client:      o.Client,
		space:       space,
		channel:     space.Channel(),
		timeout:     timeout,
		batchKeys:   batchKeys,
		batchBytes:  batchBytes,
		ackReplicas: o.AckReplicas,
		ackTimeout:  ackTimeout,
		fenceFloor:  minFenceTTL,
		fenceMargin: fenceMargin,
		id:          newToken()[:originLen],
		listening:   make(chan struct{}),
		ready:       make(chan struct{}),
		subs:        make(map[*notify.Subscription]bool),
		born:        time.Now(),
	}
	r.cluster, _ = o.Client.(*redis.ClusterClient)
	if r.cluster != nil && !o.ClassicNotices {
		r.shardChannels = shardChannelNames(r.channel)
	}
	if r.cluster == nil && o.LivePeriod > 0 { // see "A live channel" in the package doc
		r.livePeriod = o.LivePeriod
		r.heardBeat = make(chan struct{}, 1)
		r.beating = make(chan struct{})
	}
	r.valueBytes.Store(int64(max(batchBytes/batchKeys, 1)))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// A failed SUBSCRIBE is retried by the PubSub's own reconnection loop.
	r.listeners = []*listener{{ps: o.Client.Subscribe(ctx, r.channel)}}
	for _, ch := range r.shardChannels {
		r.listeners = append(r.listeners, &listener{shard: ch, ps: r.cluster.SSubscribe(ctx, ch)})
	}
	r.unconfirmed = len(r.listeners)
	listenCtx, stopListen := context.WithCancel(context.Background())
	r.stopListen = stopListen
	var listeners sync.WaitGroup
	for _, l := range r.listeners {
		listeners.Go(func() { r.listen(listenCtx, l) })
	}
	go func() {
		listeners.Wait()
		close(r.listening)
	}()
	if r.beating != nil {
		go r.beat(listenCtx)
	}
	select {
	case <-r.ready:
	case <-ctx.Done():
	}
	r.mu.Lock()
	r.started = true
	r.mu.Unlock()
	if _, err := r.generation(ctx, "new", ""); err == nil { // or at the first call that needs it
		r.reached.Store(true)
	}
	return r, nil
}

// checkClient refuses a client that would ignore context deadlines, or whose
// pub/sub would not reach every key's notices.
func checkClient(c redis.UniversalClient) error {
	var enabled bool
	switch c := c.(type) {
	case nil:
		return errors.New("redisstore: Options.Client is nil")
	case *redis.Client:
		if c == nil {
			return errors.New("redisstore: Options.Client is a nil *redis.Client")
		}
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		if c == nil {
			return errors.New("redisstore: Options.Client is a nil *redis.ClusterClient")
		}
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return errors.New("redisstore: Options.Client is a *redis.Ring, which is not supported: its shards do not share pub/sub, so notices would be lost; use a Cluster")
	default:
		return nil
	}
	if !enabled {
		return errors.New("redisstore: Client must have ContextTimeoutEnabled set, or Redis calls ignore their deadlines; build it with redisstore.NewClient or set the option")
	}
	return nil
}

// Scripts, each prefixed with the envelope layout and the shared functions
// of lib.lua.
var (
	acquireScript       = script("acquire")
	writeScript         = script("write")
	setScript           = script("set")
	invalidateScript    = script("invalidate")
	extendScript        = script("extend")
	releaseScript       = script("release")
	writeReleaseScript  = script("writerelease")
	markStaleScript     = script("markstale")
	invalidateAllScript = script("invalidateall")
)

//go:embed scripts/*.lua
var scripts embed.FS

func script(name string) *redis.Script {
	prelude := fmt.Sprintf("local VERSION, FLAGS, SOFT, HARD, DELTA, FENCE, HEADER = %d, %d, %d, %d, %d, %d, %d\n"+
		"local KNOWNFLAGS1, MAXEXPIRY, MAXFENCE = %d, %d, %d\n"+
		"local TAGGED, MAXTAGS, MAXTAGLEN, NOTICEVALUE = %d, %d, %d, %d\n",
		envelope.Version, envelope.FlagsOffset, envelope.SoftOffset, envelope.HardOffset, envelope.DeltaOffset,
		envelope.FenceOffset, envelope.HeaderSize, envelope.KnownFlags+1, int64(envelope.MaxExpiry), uint64(envelope.MaxFence),
		envelope.FlagTagged, envelope.MaxTags, envelope.MaxTagLen, NoticeValueMax)
	return redis.NewScript(prelude + embedded("lib") + embedded(name))
}

func embedded(name string) string {
	b, err := scripts.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		panic(err) // the file is embedded: only a build without it gets here
	}
	return string(b)
}

// Load returns the envelope stored under key with one GET, or nil when there
// is none. It does not check the bytes: the cache decodes them.
func (r *Remote) Load(ctx context.Context, key string) ([]byte, error) {
	if err := r.check("load", key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	n, err := r.names(ctx, "load", key)
	if err != nil {
		return nil, err
	}
	b, err := r.client.Get(ctx, n.Value).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		return nil, r.fail("load", key, err)
	}
	return b, nil
}

// Write stores env, its fence field set to fence, under key for ttl if fence
// is key's current fence (zero for a key never fenced, or whose fence key
// has expired or been evicted), keeps the fence key at least as long,
// announces the change and reports whether it wrote. An env that does not decode is an error and
// changes nothing.
func (r *Remote) Write(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration) (bool, error) {
	ms, err := r.prepare("write", key, env, ttl)
	if err != nil {
		return false, err
	}
	if fence > envelope.MaxFence {
		return false, nil // no key's fence gets there
	}
	n, err := r.names(ctx, "write", key)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	wrote, err := writeScript.Run(ctx, r.client, []string{n.Value, n.Fence},
		strconv.FormatUint(fence, 10), ms, env, r.noticeChannel(ctx, n.Value), key, r.fenceTTL(ms)).Int64()
	if tryAgain(err) { // the key's slot is migrating
		ok, err := r.writeSplit(ctx, n, key, env, fence, ms)
		if err != nil {
			return ok, r.fail("write", key, err)
		}
		return ok, nil
	}
	if err != nil {
		return false, r.fail("write", key, err)
	}
	return wrote == 1, nil
}

// WriteRelease does what Write and then Release do, in one script (one round
// trip): it stores env under fence if fence is still key's current fence,
// then drops key's lease if token still holds it, and in any case announces
// the completion. It reports whether it wrote. When Redis refuses the write
// inside the script (OOM: maxmemory reached under noeviction), the lease
// is still dropped and the completion announced, and the error wraps
// [ErrWriteFailed]. Any other error means the script may not have run (a
// value longer than Redis' proto-max-bulk-len is refused before it runs,
// and Redis drops the connection): the caller releases with Release, which
// reconnects.
func (r *Remote) WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	ms, err := r.prepare("write-release", key, env, ttl)
	if err != nil {
		return false, err
	}
	if fence > envelope.MaxFence {
		return false, r.Release(ctx, key, token) // no key's fence gets there
	}
	n, err := r.names(ctx, "write-release", key)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	res, err := writeReleaseScript.Run(ctx, r.client, []string{n.Value, n.Fence, n.Lease},
		strconv.FormatUint(fence, 10), ms, env, r.noticeChannel(ctx, n.Value), key, token, r.id, r.fenceTTL(ms)).Result()
	if tryAgain(err) { // the key's slot is migrating
		wrote, err := r.writeReleaseSplit(ctx, n, key, env, fence, ms, token)
		r.mu.Lock()
		r.wake(key)
		r.mu.Unlock()
		if err != nil {
			return wrote, r.fail("write-release", key, err)
		}
		return wrote, nil
	}
	if err != nil {
		return false, r.fail("write-release", key, err)
	}
	r.mu.Lock()
	r.wake(key)
	r.mu.Unlock()
	switch res := res.(type) {
	case int64:
		return res == 1, nil
	case string: // the script released, but Redis refused the write
		return false, writeFailed(key, cmp.Or(res, "write failed"))
	}
	return false, fmt.Errorf("redisstore: write-release %q: unexpected reply %v (the lease was released)", key, res)
}

// Set advances key's fence, stores env under the new fence for ttl, announces
// the change and returns the new fence. An env that does not decode is an
// error and changes nothing, the fence included.
func (r *Remote) Set(ctx context.Context, key string, env []byte, ttl time.Duration) (uint64, error) {
	ms, err := r.prepare("set", key, env, ttl)
	if err != nil {
		return 0, err
	}
	n, err := r.names(ctx, "set", key)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+r.ackTimeout)
	defer cancel()
	fence, err := r.change(ctx, setScript, []string{n.Value, n.Fence}, ms, env, r.noticeChannel(ctx, n.Value), key, r.fenceTTL(ms)).Int64()
	if tryAgain(err) { // the key's slot is migrating
		f, err := r.setSplit(ctx, n, key, env, ms)
		if err != nil {
			return 0, r.fail("set", key, err)
		}
		return f, nil
	}
	if err != nil {
		return 0, r.fail("set", key, err)
	}
	return uint64(fence), nil
}

// Invalidate advances key's fence, deletes its value and announces the
// change under the new fence.
func (r *Remote) Invalidate(ctx context.Context, key string) error {
	if err := r.check("invalidate", key); err != nil {
		return err
	}
	n, err := r.names(ctx, "invalidate", key)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+r.ackTimeout)
	defer cancel()
	err = r.change(ctx, invalidateScript, []string{n.Value, n.Fence}, r.noticeChannel(ctx, n.Value), key, r.fenceTTL(0)).Err()
	if tryAgain(err) { // the key's slot is migrating
		_, err = r.invalidateSplit(ctx, n, key)
	}
	if err != nil {
		return r.fail("invalidate", key, err)
	}
	return nil
}

// Acquire returns key's envelope if it has a whole header of a known version
// and its soft expiry is later than both the server's clock and after;
// otherwise how long the current lease has left if one is held; otherwise it
// takes the lease for ttl under a new random token and advances the fence.
func (r *Remote) Acquire(ctx context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	if err := r.check("acquire", key); err != nil {
		return remote.Grant{}, err
	}
	ms, err := millis("acquire", key, ttl)
	if err != nil {
		return remote.Grant{}, err
	}
	afterMs := max(after.UnixMilli(), 0) // every stored soft expiry is ≥ 0
	token := newToken()
	n, err := r.names(ctx, "acquire", key)
	if err != nil {
		return remote.Grant{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	res, err := acquireScript.Run(ctx, r.client, []string{n.Value, n.Lease, n.Fence}, token, ms, afterMs, r.fenceTTL(ms), "0", r.noticeChannel(ctx, n.Value), r.id, key).Slice()
	if tryAgain(err) { // the key's slot is migrating
		g, err := r.acquireSplit(ctx, n, key, token, ms, afterMs)
		if err != nil {
			return remote.Grant{}, r.fail("acquire", key, err)
		}
		return g, nil
	}
	if err != nil {
		return remote.Grant{}, r.fail("acquire", key, err)
	}
	g, _, ok := grant(res, token)
	if !ok {
		return remote.Grant{}, fmt.Errorf("redisstore: acquire %q: unexpected reply %v", key, res)
	}
	return g, nil
}

// grant reads the acquire script's reply to an acquisition under token: the
// Grant, and the stored value that was not fresh if the script was asked
// for it and one is stored. It reports false for a reply of another shape.
func grant(res []any, token string) (g remote.Grant, stale []byte, ok bool) {
	if len(res) == 3 {
		v, isString := res[2].(string)
		if !isString {
			return remote.Grant{}, nil, false
		}
		stale = append(make([]byte, 0, len(v)), v...) // not nil, even when empty
	} else if len(res) != 2 {
		return remote.Grant{}, nil, false
	}
	switch kind, _ := res[0].(int64); kind {
	case 1:
		if v, isString := res[1].(string); isString && len(res) == 2 {
			return remote.Grant{Value: []byte(v)}, nil, true
		}
	case 2:
		if f, isInt := res[1].(int64); isInt && f > 0 {
			return remote.Grant{Token: token, Fence: uint64(f)}, stale, true
		}
	case 3:
		if left, isInt := res[1].(int64); isInt && left > 0 {
			return remote.Grant{HeldFor: time.Duration(left) * time.Millisecond}, stale, true
		}
	}
	return remote.Grant{}, nil, false
}

// Extend pushes key's lease expiry to ttl from now if token still holds it,
// keeping the fence key at least as long, and reports whether it did.
func (r *Remote) Extend(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if err := r.check("extend", key); err != nil {
		return false, err
	}
	ms, err := millis("extend", key, ttl)
	if err != nil {
		return false, err
	}
	if token == "" {
		return false, nil // no lease holds the empty token
	}
	n, err := r.names(ctx, "extend", key)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	ok, err := r.run(ctx, extendScript, []string{n.Lease, n.Fence}, token, ms, r.fenceTTL(ms)).Int64()
	if err != nil {
		return false, r.fail("extend", key, err)
	}
	return ok == 1, nil
}

// Release drops key's lease if token still holds it, and in any case
// announces that key's load has completed: to this Remote's Wait-ers before
// it returns, to other Remotes' through the channel.
func (r *Remote) Release(ctx context.Context, key, token string) error {
	if err := r.check("release", key); err != nil {
		return err
	}
	n, err := r.names(ctx, "release", key)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := releaseScript.Run(ctx, r.client, []string{n.Lease}, token, r.noticeChannel(ctx, n.Value), r.id, key).Err(); err != nil {
		return r.fail("release", key, err)
	}
	r.mu.Lock()
	r.wake(key)
	r.mu.Unlock()
	return nil
}

// Wait blocks until a completion for key is announced after it was called,
// or the subscription reconnects (announcements may have been lost
// meanwhile), or ctx ends or the Remote is closed; the last two return an
// error. It makes no Redis call.
//
// A completion announced by this Remote's Release counts when Release
// returns; one announced by another Remote counts when its notice reaches
// this Remote, so one announced just before Wait was called may still end
// it.
func (r *Remote) Wait(ctx context.Context, key string) error {
	if err := r.check("wait", key); err != nil {
		return err
	}
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return fmt.Errorf("redisstore: wait %q: %w", key, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("redisstore: wait %q: %w", key, err)
	}
	w := r.waits.Add(key)
	hook := r.onWait
	r.mu.Unlock()
	if hook != nil {
		hook(key)
	}

	select {
	case <-w.C():
		if r.closed.Load() {
			return fmt.Errorf("redisstore: wait %q: %w", key, ErrClosed)
		}
		return nil
	case <-ctx.Done():
		r.mu.Lock()
		defer r.mu.Unlock()
		r.waits.Leave(w)
		return fmt.Errorf("redisstore: wait %q: %w", key, ctx.Err())
	}
}

// Subscribe calls fn, on one goroutine per subscription and in the order
// they were heard (each key's in the order they were made), with each
// change of a key that any Remote on the same Redis and prefix made: a
// write, a Set, or an Invalidate (Dropped), under the fence of that change
// (refused writes are not announced), until stop is called. After one of
// the Remote's subscriptions to the channels reconnects, fn gets the zero
// Notice: notices may have been lost, drop everything. Notices are never waited for: each
// subscription queues up to 1024 messages from the channel (one notice
// each, or the up to 256 of one batch notice), and when a slow fn lets the
// queue fill, the queued notices are replaced by a single zero Notice.
//
// stop drops the notices still queued, waits until fn has returned and the
// goroutine has exited, and may be called more than once; it must not be
// called from fn. After Close, Subscribe starts nothing and fn is never
// called.
func (r *Remote) Subscribe(fn func(remote.Notice)) (stop func()) {
	return r.subscribe(fn, false)
}

// Close ends the subscription and its goroutine, stops every Subscribe
// goroutine and wakes every Wait with ErrClosed. Later calls return an error
// wrapping ErrClosed. It does not close the Client. Close may be called more
// than once; it must not be called from a Subscribe fn.
func (r *Remote) Close() error {
	r.mu.Lock()
	if r.closed.Swap(true) {
		r.mu.Unlock()
		<-r.listening
		return nil
	}
	r.waits.WakeAll()
	subs := r.subs
	r.subs = make(map[*notify.Subscription]bool)
	r.mu.Unlock()

	for s := range subs {
		s.Stop()
	}
	r.holds.StopAll()
	r.stopListen()
	var err error
	for _, l := range r.listeners {
		err = cmp.Or(err, l.close())
	}
	<-r.listening
	if r.beating != nil {
		<-r.beating
	}
	if err != nil {
		return fmt.Errorf("redisstore: close: %w", err)
	}
	return nil
}

// subscribed handles a confirmation of a listener's subscription, its
// first if first. Every one but the first ones that New waits for follows
// a time without that subscription, in which notices may have been lost:
// subscribers drop everything, Wait-ers wake to re-read.
func (r *Remote) subscribed(first bool) {
	r.reached.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if first && !r.started {
		if r.unconfirmed--; r.unconfirmed == 0 {
			close(r.ready)
		}
		return
	}
	r.lastBeat = 0
	r.genKnown.Store(false) // an InvalidateAll may have been missed
	for s := range r.subs {
		s.Push(notify.Notice{})
	}
	r.waits.WakeAll()
}

// dispatch handles one notice from the channel; it ignores what it cannot
// parse.
func (r *Remote) dispatch(payload string) {
	if payload != "" && payload[0] == batchNotice {
		r.dispatchBatch(payload)
		return
	}
	if payload != "" && payload[0] == liveNotice {
		r.heard(payload)
		return
	}
	m, ok := parseNotice(payload)
	if !ok {
		return
	}
	if m.kind == holdNotice {
		// Called here, before the next message is read, so that a Watch
		// a subscriber registers hears the holder's completion.
		if m.origin != r.id && !r.closed.Load() { // this Remote's own leases are no news to it
			r.holds.Call(notify.Notice{Key: m.key, Held: time.Now().Add(time.Duration(m.fence) * time.Millisecond)})
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m.kind {
	case changeNotice, dropNotice, valueNotice:
		n := notify.Notice{Key: m.key, Fence: m.fence, Dropped: m.kind == dropNotice, Value: m.value}
		for s := range r.subs {
			s.Push(n)
		}
	case tagNotice:
		for s := range r.subs {
			s.Push(notify.Notice{Tag: m.key, Fence: m.fence})
		}
	case doneNotice:
		if m.origin != r.id { // Release woke this Remote's own Wait-ers
			r.wake(m.key)
		}
	case clearNotice:
		r.cleared(m.fence)
	}
}

// wake ends the current generation of key's Wait-ers. r.mu is held.
func (r *Remote) wake(key string) {
	r.waits.Wake(key)
}

// Kinds of message, their first byte on the channel.
const (
	changeNotice = 'c' // "c<fence>:<key>": key's value stored under fence
	valueNotice  = 'v' // "v<fence>:<len(key)>:<key><envelope>": key's value, envelope, stored under fence
	dropNotice   = 'x' // "x<fence>:<key>": key's value deleted under fence
	doneNotice   = 'd' // "d<origin><key>": key's load completed
	batchNotice  = 'b' // "b<origin>" then records: the loads a WriteReleaseMany ended (batch.go)
	clearNotice  = 'g' // "g<generation>": every key retired (InvalidateAll)
	tagNotice    = 't' // "t<version>:<tag>": tag's version advanced (InvalidateTag)
	holdNotice   = 'l' // "l<ms>:<origin><key>": key's lease taken for ms (Acquire)
)

// originLen is the length of a Remote's id in completion notices.
const originLen = 16

// NoticeValueMax is the longest envelope, in bytes, that a change notice
// carries ([remote.Notice] Value): the write-back of a load under a lease
// (Write, WriteRelease) and a Set publish the envelope they stored, up to
// this size, so that the replicas holding the key replace their copies
// with no GET; a longer one is announced as a plain change, and each
// replica that holds the key reads it once. The batch write-backs
// (WriteReleaseMany) and MarkStale announce plain changes. An envelope
// is the value's encoded bytes plus a header of about 40 bytes (more with
// tags).
const NoticeValueMax = 1024

// maxHoldMs is the longest lease a hold notice may announce: a day is far
// beyond any lease a cache takes, and keeps the time it names in range.
const maxHoldMs = 24 * 60 * 60 * 1000

// message is a parsed message from the channel.
type message struct {
	kind   byte   // changeNotice, valueNotice, dropNotice, doneNotice, clearNotice, tagNotice or holdNotice
	origin string // the announcing Remote's id; completions and holds only
	key    string // may be empty: "" is a key
	fence  uint64 // changes and drops; the generation of a clearNotice, the version of a tagNotice, the lease ms of a holdNotice
	value  string // the envelope a valueNotice carries, unchecked: the cache decodes it
}

// parseNotice parses a message from the channel, as the scripts format it.
// The key is the rest of the message after the first ':' of a change, or
// after the fixed-length origin of a completion or a hold, so it may hold
// any bytes.
func parseNotice(p string) (message, bool) {
	if p == "" {
		return message{}, false
	}
	switch p[0] {
	case changeNotice, dropNotice, tagNotice:
		i := strings.IndexByte(p, ':')
		if i < 2 || p[1] == '0' && i > 2 { // canonical digits only
			return message{}, false
		}
		f, err := strconv.ParseUint(p[1:i], 10, 64)
		if err != nil || f == 0 || f > envelope.MaxFence { // a change advances the fence past 0
			return message{}, false
		}
		return message{kind: p[0], key: p[i+1:], fence: f}, true
	case valueNotice:
		fs, rest, found := strings.Cut(p[1:], ":")
		f, ok := positive(fs)
		if !found || !ok || f > envelope.MaxFence {
			return message{}, false
		}
		ls, rest, found := strings.Cut(rest, ":")
		n, ok := uint64(0), ls == "0"
		if !ok {
			n, ok = positive(ls)
		}
		if !found || !ok || n > uint64(len(rest)) {
			return message{}, false
		}
		return message{kind: valueNotice, key: rest[:n], fence: f, value: rest[n:]}, true
	case doneNotice:
		if len(p) < 1+originLen {
			return message{}, false
		}
		return message{kind: doneNotice, origin: p[1 : 1+originLen], key: p[1+originLen:]}, true
	case holdNotice:
		ms, rest, found := strings.Cut(p[1:], ":")
		if !found || len(rest) < originLen {
			return message{}, false
		}
		n, ok := positive(ms)
		if !ok || n > maxHoldMs {
			return message{}, false
		}
		return message{kind: holdNotice, fence: n, origin: rest[:originLen], key: rest[originLen:]}, true
	case clearNotice:
		if len(p) < 2 || p[1] == '0' {
			return message{}, false // canonical digits, and a generation past 0
		}
		g, err := strconv.ParseUint(p[1:], 10, 64)
		if err != nil || g > envelope.MaxFence {
			return message{}, false
		}
		return message{kind: clearNotice, fence: g}, true
	}
	return message{}, false
}

// check refuses a call on a closed Remote.
func (r *Remote) check(op, key string) error {
	if r.closed.Load() {
		return fmt.Errorf("redisstore: %s %q: %w", op, key, ErrClosed)
	}
	return nil
}

// prepare checks a write's arguments and returns its ttl in milliseconds.
func (r *Remote) prepare(op, key string, env []byte, ttl time.Duration) (int64, error) {
	if err := r.check(op, key); err != nil {
		return 0, err
	}
	ms, err := millis(op, key, ttl)
	if err != nil {
		return 0, err
	}
	if _, err := envelope.Decode(env); err != nil {
		return 0, fmt.Errorf("redisstore: %s %q: %w: %w", op, key, remote.ErrRejected, err)
	}
	return ms, nil
}

// fenceTTL returns the least TTL, in milliseconds, of a fence key after a
// change that keeps a value or a lease for ms milliseconds (0 for neither).
func (r *Remote) fenceTTL(ms int64) int64 {
	return max(ms, r.fenceFloor.Milliseconds()) + r.fenceMargin.Milliseconds()
}

// millis returns ttl in whole milliseconds, rounded up (Redis expiries are in
// milliseconds), or an error if ttl is not positive.
func millis(op, key string, ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("redisstore: %s %q: ttl %v is not positive: %w", op, key, ttl, remote.ErrRejected)
	}
	ms := ttl / time.Millisecond
	if ttl%time.Millisecond != 0 {
		ms++
	}
	return int64(ms), nil
}

// fail wraps the error of a Redis call. An error reply about this call's key
// alone wraps [remote.ErrRejected], so that it does not count against the
// server's health: herd's own script errors (a fence key that holds no
// fence), WRONGTYPE (a key of herd's overwritten by another type) and a
// script that failed on the key's bytes. Transport errors, timeouts and
// server-wide replies (LOADING, READONLY, CLUSTERDOWN, OOM, …) do count.
// On a Cluster, an error that may mean the slot map is out of date has it
// reloaded (see reload).
func (r *Remote) fail(op, key string, err error) error {
	r.reload(err)
	var reply redis.Error
	if errors.As(err, &reply) {
		msg := reply.Error()
		if strings.HasPrefix(msg, "HERD ") || strings.HasPrefix(msg, "WRONGTYPE ") || strings.HasPrefix(msg, "ERR user_script:") {
			return fmt.Errorf("redisstore: %s %q: %w: %w", op, key, remote.ErrRejected, err)
		}
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

// newToken returns a lease token: 16 random bytes in hex.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails; it crashes the program instead
	return hex.EncodeToString(b[:])
}
