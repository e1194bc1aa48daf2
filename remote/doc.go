// Package remote is the contract between a herd Cache and its remote tier:
// the [Store] every replica reads and writes, the [Lease] that lets one
// replica of a fleet load a key while the others wait, and the optional
// interfaces that let a tier do more in fewer round trips.
//
// A user never calls these methods; a Cache does. This package is for
// whoever writes a tier for another backend (Valkey, DragonflyDB,
// memcached, a SQL table), and its doc is the guide. memory.Remote (one
// process) and redisstore (Redis) implement every interface here, and are
// the references to read next.
//
// # What a tier keeps
//
// For each key a tier keeps three things, and changes them together, in one
// atomic step of its backend (a transaction, a Lua script, a compare-and-swap):
//
//   - an envelope: opaque bytes in the format of package envelope, with a
//     hard expiry given by the ttl of the call that wrote it. The tier
//     stamps the envelope's fence field ([envelope.SetFence]) and reads its
//     soft expiry ([envelope.Decode]) to tell a fresh value in [Lease.Acquire];
//     it never needs the value itself;
//   - a fence: a number that only grows (below 2^53), outlives the value and
//     the lease, and refuses every [Store.Write] made under an older one. The
//     fence is what keeps a slow or paused loader from overwriting a newer
//     value; the lease only saves work;
//   - a lease: a token and an expiry. [Lease.Acquire] takes it with a new
//     fence; [Lease.Release] gives it up and announces the load's completion
//     to the replicas that wait in [Lease.Wait].
//
// A tier without a Lease is allowed (each replica then loads a key once),
// but a Store is always fenced: Set and Invalidate advance the fence.
//
// # Errors
//
// Wrap [ErrRejected] in the error of a call the tier refused for that call
// alone: a ttl that is not positive, an envelope that does not decode. A
// Cache's breaker counts every other error as a sign that the tier is down,
// and after enough of them serves from its local tier alone for a while; a
// call that would block longer than its context allows should return the
// context's error.
//
// # Optional interfaces
//
// Each optional interface is found by a type assertion on the Store or the
// Lease given to the Cache, and each turns on something a Cache cannot do
// without it:
//
//   - [Notifier] (with package notify for the delivery): other replicas drop
//     or replace their local copy when a key changes, instead of waiting for
//     NearTTL;
//   - [LiveNotifier]: while its notices are proven complete, local copies
//     are trusted until their soft expiry or a notice, with no re-read of
//     the Store each NearTTL;
//   - [Watcher]: lease losers wait for the holder's completion without a
//     goroutine each and without missing one announced before they listen;
//     [BatchWatcher] registers a batch's keys in one call, and
//     [CompletionCounter] lets a replica know that a hold it heard of
//     completed with no registration at all;
//   - [HoldNotifier] (with notify.Direct for a delivery made before the
//     holder can complete, or a notify.Subscription queue and Notice.Seq
//     for one made later): a replica that hears another take a key's
//     lease makes no lease attempt of its own until the holder's notice
//     or announced time, and due refreshes are staggered so that the
//     first announcement reaches the others in time;
//   - [WriteReleaser], [BatchStore], [BatchLease]: fewer round trips;
//   - [Staler], [Clearer], [Tagger], [HotSet]: Cache.MarkStale,
//     Cache.InvalidateAll, Cache.InvalidateTag and tagged values, and
//     Options.ShareHotKeys.
//
// # Sketches for other backends
//
// Valkey and DragonflyDB speak the Redis protocol: redisstore works against
// them as it is, and a tier of its own can keep redisstore's key layout
// (package keyspace) so that both share one cache.
//
// memcached: the envelope and the fence in one item per key, changed with
// gets and cas; the lease in a second item added with add (which fails when
// it is held) and an expiry of the lease's ttl. memcached has no pub/sub,
// so such a tier is no Notifier: a Cache then bounds how stale a replica's
// copy may be by NearTTL, and its lease losers re-read the Store after a
// bounded back-off instead of being woken.
//
// A SQL table: a row per key (key, fence, envelope, hard expiry, lease
// token, lease expiry); Write is an UPDATE ... WHERE fence = $fence, Set
// and Invalidate an UPDATE that adds one to the fence, and Acquire an
// INSERT ... ON CONFLICT DO UPDATE that takes the lease only when the row's
// lease has expired and its value is not fresh, all in one statement or
// transaction. PostgreSQL's LISTEN/NOTIFY can carry the notices of a
// [Notifier] and the completions that end a [Lease.Wait].
//
// # Testing a tier
//
// Package storetest holds every tier to the same contract, optional
// interfaces included, against real time: call storetest.Run from a test
// with a function that returns a Store and Lease over a fresh or shared
// backend. The map-backed tier in this package's tests, written from the
// public packages alone, is the smallest tier that passes it.
package remote
