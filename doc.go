// Package herd is a get-or-load cache that keeps a hot key from turning into
// a thundering herd on the backing store.
//
// A [Cache] answers Get from a local tier of decoded values and, when a
// [remote.Store] is configured, a remote tier shared by every replica. On a miss it
// lets one load per key run at a time in the process (coalescing), and with a
// [remote.Lease] one per fleet; early refresh (XFetch), stale-while-revalidate, TTL
// jitter and a backing-store [limiter.Limiter] keep that one load off the
// readers' path and within the backing store's capacity.
//
// # Keys
//
// A key must hold every input that changes the value it names: the tenant,
// the caller's authorisation scope, the locale, the query parameters. Build
// keys with [Key], which encodes its parts so that no two different part
// lists give the same key.
//
// # Consistency
//
// What a reader may see:
//
//   - After Set or Invalidate on a replica returns, that replica's next Get
//     returns the new value (or loads one), even if a Get that ran meanwhile
//     read the old value from the Store. A load that began before the Set or
//     Invalidate returned never writes its value into either tier
//     afterwards: in this process the local generation refuses it, and Set
//     and Invalidate wait for this process's own writes of the key to the
//     Store to land first; with a [remote.Lease], the remote fence refuses it on
//     every replica. Callers that had already joined that load may still
//     receive its value.
//   - A load's callers get its value as soon as it returns; its write to the
//     Store, and the release of its lease, follow in the background, bounded
//     by LoadTimeout. A write that the fence refuses drops the copy the load
//     put in the local tier. A load whose lease could have lapsed (the last
//     acquisition or extension the Lease granted was sent more than
//     LeaseTTL ago: a paused process, a frozen connection) puts its value
//     in the local tier only once the Store has taken its write, so that a
//     value another replica's takeover or a Set fenced out is never served
//     there to a read that starts later. A write-back that fails still
//     releases the lease and announces the load's completion, so other
//     replicas stop waiting for it at once. Close waits for pending writes.
//   - Other replicas drop their local copy when an Invalidate's notice
//     reaches them. On a write's notice (a load's write-back or a Set) they
//     go on serving their copy while one read of the Store replaces it, so
//     for about one round trip more; when the notice carries the value
//     ([remote.Notice] Value: redisstore's do up to 1 KiB), a replica that
//     holds an older copy replaces it from the notice with no read, and one
//     that holds none stores nothing. Since notices can be lost, a replica may
//     serve its old copy for at most 2×[Options.NearTTL] after the change
//     (plus, if that copy is stale, the stale window below): past NearTTL a
//     copy is served while one background read replaces it, and past
//     2×NearTTL it is read again on the reader's path. A copy's age counts
//     from when the read that brought it was sent, not from when its
//     answer came, so a slow answer holding a value changed meanwhile
//     does not stretch that bound; and a read sent before the replica
//     learnt that it lost notices brings no trusted copy.
//   - A Store that proves its notices complete ([remote.LiveNotifier], as
//     redisstore does with Options.LivePeriod) spares that re-read: while
//     the last proof holds (redisstore: twice its period P after it was
//     made), copies are trusted until their soft expiry or a notice, with
//     no read of the Store. A lost notice stops the proofs, or brings the
//     zero Notice, so a copy is then served stale at most until the last
//     proof ends (2P after it was made) and, while one read replaces it,
//     NearTTL longer: at most max(2P + NearTTL, 2×NearTTL) after the
//     change, which 2P + 2×NearTTL bounds. After a lapse the NearTTL rule
//     above applies, counted from the end of the last proof.
//   - A Lease that announces its leases ([remote.HoldNotifier], as
//     memory.Remote and redisstore do) keeps the losers quiet: a replica
//     that hears another take a key's lease makes no lease attempt for the
//     key until the holder's completion or change notice, or the announced
//     lease time (at most LeaseTTL) has passed, so a crashed holder is
//     taken over then; its readers are served the stale value meanwhile.
//     Once a replica knows it has company (it heard another's hold, or one
//     of its lease attempts found another's lease), its due refreshes wait
//     a random delay below min(100 ms, SoftTTL/20) before they ask, so
//     that the first one's announcement reaches the others first;
//     refreshes ahead of pinned and hot keys do not wait.
//   - Between the soft and the hard TTL a value is stale: Get returns it at
//     once and one background refresh runs (stale-while-revalidate); if that
//     refresh fails the stale value goes on being served until the hard TTL
//     (stale-if-error). A value is never served past its hard TTL.
//   - InvalidateAll is Invalidate for every key at once: after it returns
//     on a replica, nothing stored before is served there, other replicas
//     drop their local tiers on its notice (within 2×NearTTL if it is
//     lost), and a load that began before writes neither tier (on other
//     replicas, with a Lease). The replica's own notice of it, arriving
//     later, drops nothing loaded since.
//   - InvalidateTag retires every entry whose load gave it the tag
//     ([Tags]), and whose load began before it: after it returns on a
//     replica, no such entry is served there; other replicas refuse them
//     once its notice reaches them (within 2×NearTTL if it is lost), and
//     a replica that reads one from the Store refuses it there and then.
//     A load that was running is served to its callers but cached
//     nowhere. A load's beginning is its lease's fence, on the Store's
//     clock; without a Lease, the replica's own clock, so keep the clocks
//     in sync.
//   - After MarkStale on a replica returns, the value is stale on that
//     replica (and in the Store): it is served as stale values are, while
//     one refresh replaces it, and a load that began before MarkStale is
//     refused as after Set. Other replicas mark their copies on the notice,
//     within the same bound as a write's notice.
//   - GetMany serves each key as Get would, with the same promises; a key
//     it loads counts as loaded by a Get whose load began when the batch
//     load began.
//   - GetIfPresent reports only what Get would serve at once as fresh,
//     within the same bound; it never loads, reads the Store or refreshes.
//   - Peek reports what Get would serve without loading, fresh or stale,
//     from the local tier or one shared read of the Store; it starts and
//     waits for no load, refresh or lease.
//   - A Get with [Accept] never returns a value its function refuses: it
//     loads instead (under the lease, which a refused value does not stop),
//     and starts no refresh of a value it takes.
//   - With NoStale (per cache or per call) nothing stale is ever served: a
//     stale value is a miss, and a failed load returns its error.
//   - Errors are never cached; only [ErrNotFound] is, and only when
//     [Options.NegativeTTL] is set.
//   - A replica cut off from the Store (its breaker open: see
//     [Options.BreakerThreshold]) makes no Store or Lease call for its
//     readers, tag versions included, but one probe per
//     [Options.BreakerCooldown]; only what was under way when it opened
//     goes on (a running load's lease extension, release and write-back, a
//     lease loser's wait). Meanwhile it serves each local copy
//     it holds as if no change could have been missed, past NearTTL and
//     past 2×NearTTL alike: fresh until its soft TTL, then stale (unless
//     NoStale) until its hard TTL, never past it. So a cut-off replica may
//     serve a value up to its hard TTL after it was loaded or read from
//     the Store, blind to every Set, Invalidate, InvalidateTag and
//     MarkStale made on other replicas since. Its own Set, Invalidate and
//     MarkStale drop its local copy and return an error wrapping
//     [ErrDegraded], leaving the Store, and so the other replicas' copies,
//     as they were. Misses and refreshes load once per key per replica (in
//     process coalescing, no lease), and their values go to the local tier
//     only: a fleet of N cut-off replicas loads a key up to N times per
//     expiry. A load whose tags' versions the replica does not know is
//     served to its callers and cached nowhere. When a probe is due, the
//     readers of a copy that is past NearTTL (or superseded, or older than
//     the last lost notice) join the flight that makes it and wait for it,
//     at most the Store's call timeout, and get the copy if the probe
//     fails. A failure counts towards opening the breaker only if its call
//     began after the breaker last changed state and after the last
//     failure counted, so the calls that a probe's success or one stall of
//     the server overtakes do not open it again. Once a probe succeeds the
//     breaker closes, and every local copy put before is read again from
//     the Store on its reader's path (one read per key, shared) before it
//     is served.
//
// Fencing holds while the Store keeps the writes it acknowledged; see the
// Store implementation for what that requires of its servers.
//
// # The remote tier under load
//
// A burst of callers of one key costs the remote tier one read per replica:
// the callers that arrive while a read of the key is in flight share it.
// A replica that finds a key's lease held by another makes no further
// attempt at that lease until the holder's completion notice arrives or the
// lease time the holder had left has passed: meanwhile its stale reads are
// served at once and start no refresh, its FailFast misses fail fast
// without asking, and its Wait losers re-read the Store between notices.
// With a Lease that is a [remote.Watcher], the holder's completion is listened for
// from before the attempt that found the lease held, so a completion that
// comes before the wait begins, or a holder that ended its lease without a
// value, ends the wait at once. LeaseWait bounds the wait for each holder:
// a loser whose holder completed and whose next attempt finds another
// holder waits for that one anew, until its own context ends. The losers
// of one call wait together, on the caller's batch: the keys whose holders
// completed at once take the value the completion carried, from a Lease
// that is a [remote.ValueWatcher] (unless the key changed on this replica
// since the call began, or the value has tags), or re-read the Store in
// one call, and those with no value ask for their leases again in one
// call, with no goroutine, timer or context of their own (with a Lease
// that is no Watcher, each waits with Lease.Wait on a goroutine). A
// background refresh takes its limiter slot before any remote call, so a
// refresh the limiter sheds touches no remote key, and a shed refresh of a
// stale value waits at High priority once half of its stale window has
// passed (see [Options.RefreshBackoff]).
//
// # Time
//
// No duration option may exceed [MaxTTL] (100 years), and every time the
// cache computes saturates instead of wrapping. Stored expiries end at
// 2262-04-11, where Unix nanoseconds stop fitting an int64; a stored value
// that claims a later one is corrupt, and is reloaded. The Store and this
// replica must both find a value fresh for it to be served as fresh: a
// replica whose clock runs ahead loads rather than serve what it finds
// stale.
package herd
