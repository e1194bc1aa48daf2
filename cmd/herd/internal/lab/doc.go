// Package lab runs herd's load-test scenarios against a ladder of protection layers and measures what reaches the backing store.
//
// # Fleet
//
// A run has Replicas herd.Cache values, each standing for one process of a
// fleet, over one remote tier: a memory.Remote shared by all of them
// (embedded), or one redisstore.Remote per replica on a real Redis. Every
// rung uses the same remote tier, a NearTTL of 100ms (at most half the TTL,
// so that the shared tier decides, as it does for separate processes), a
// breaker that opens after five failed remote calls, Options.Load, and a
// Recorder that notes when a stale value is served. The rung then adds,
// through herd's public options only:
//
//	none        DisableCoalescing, no Lease, Beta 0, HardTTL = SoftTTL, Jitter 0, no Limiter
//	coalescing  in-process coalescing on
//	lease       + Lease (LeaseTTL 4× the mean recompute, OnLeaseHeld Wait, LeaseWait the client timeout)
//	xfetch      + Beta 1
//	swr         + HardTTL 3× SoftTTL, OnLeaseHeld ServeStale
//	jitter      + Jitter 0.1
//	limiter     + one limiter.Limiter per replica (each replica is a process):
//	            4 slots, 1 reserved for misses, queue timeout half the client timeout
//	ahead       + RefreshAheadHot and MaxRefreshAhead the hottest fifth of the keys (1 in hot-key),
//	            in place of XFetch (Beta 0): XFetch refreshes a value at least as early as
//	            refresh-ahead does, so with both on a key read this often never runs ahead
//
// # Load and backing store
//
// Open loop (the default): Poisson arrivals at Rate per replica from a
// seeded source, each request on its own goroutine with a client timeout,
// started at its time whether or not earlier ones have been answered.
// Closed loop: Clients per replica, each waiting for its answer, then a
// think time of Clients/Rate. The backing store is an [Origin]: latency
// drawn from a [Latency] distribution, slower beyond its capacity, an
// optional failure rate, or a real PostgreSQL query (SELECT pg_sleep of the
// drawn latency). It records every call: its key, replica, start and end.
// Each value a load returns names the call that made it, so a request knows
// whether its answer came from a call that ended while it waited.
//
// # Scenarios
//
// hot-key: one key, warmed once, then expiring every TTL under traffic.
// flush: keys in steady use (seeded without backing-store calls); at a
// quarter of the run the remote tier is flushed (memory.Remote.Flush, or
// SCAN+UNLINK of the run's key prefix on Redis, never FLUSHALL) and every
// replica gets a fresh cache, as a flush with near-caches left alive would
// hide the stampede; the calls the retired caches still make are not
// counted against the promises. node-kill: keys in steady use, seeded with
// expiries spread over one TTL; at a quarter of the run the node dies
// (memory: SetDown; spawned Redis: SIGKILL, then a restart on the same
// port, empty) for 0.8 TTL, so each key expires at most once per replica
// while it is down. On Redis every client fails at once on the dead node
// (one dial attempt, no retry), so the caches' breakers open and the
// replicas load while it is down, as with the embedded store. cold-start:
// empty replicas take traffic at once (variant cold), first all warm the
// hottest fifth of the keys with Cache.Warm, through the backing store
// (variant warm), or warm it from the fleet (variant fleet). There every
// cache of the run shares its hot keys (ShareHotKeys the size of the
// hottest fifth, ShareHotKeysEvery a twentieth of the run and at least
// 100ms, as the values live far longer than a run); a running fleet keeps
// every key's value in the remote tier, written without a backing-store
// call, and one of its caches, the veteran, which never loads, reads the
// keys with their popularity (20,000 reads a period, spread over it) until
// the hot set in the Store holds its first period's keys (polled; given up
// two periods and a client timeout after the veteran started), and on
// while every replica calls Cache.WarmHot for the hottest fifth. Then the
// replicas take traffic, for a quarter of the run: none of it reaches the
// backing store. Flush and cold-start keep values for ten run lengths, so
// every load they count follows the flush or the start.
// Keys have Zipf(1.1) popularity, key 0 the hottest.
//
// slow-origin (run only when named): a database whose calls last
// ×(n/capacity)² longer with n calls in it past its capacity, 5× slower in
// the middle 30% of the run, under a hot key and Low-priority cold-key
// misses at twice what it serves; three rungs (a static limit at the
// default, one tuned to the capacity, an adaptive one). Over the simulated
// database the rungs run side by side, each with a database of its own;
// over PostgreSQL one after the other, each through a pool of its own
// whose application_name its query counts in pg_stat_activity for n, and
// with statement_timeout at the load timeout, so no backend outlives its
// run. Its checks judge the adaptive rung: mean in-flight calls while
// overloaded near the capacity, the database's p99 within 2.5× the
// healthy p99, and a share of requests answered in time at least the best
// static rung's less two standard errors of the difference, the error
// measured from the spread of that difference over 30 slices of the run.
// --quick runs it at 8× the quick timings (Options.SlowScale).
//
// # Measures
//
// An expiry event of a key is a group of backing-store calls that overlap
// in time: every call starting while another call for the key is still
// running recomputes the same expiry. Calls per expiry in hot-key are the
// calls after warm-up over these events (an event whose first call came too
// late to see its stampede whole is left out); in the other scenarios the
// event is the flush, the kill or the start. A request waited on the
// backing store when it was answered by a call that ended after it began,
// or failed, and took at least a quarter of the mean recompute time.
// Promises count loads: calls that did not fail (a drawn failure is retried
// by design).
//
// Cold-start's warm variants count the backing-store calls that started
// while the replicas warmed (warm_calls), and the requests for a warmed key
// that waited: one of the hottest fifth (warm), or one the replica's local
// tier held once WarmHot returned (fleet; Cache.GetIfPresent). The fleet
// variant also reports the veteran's reads, the hot set's size, and for the
// replica that did worst the keys it warmed, how many of the hottest fifth
// they are, and the share of the hottest fifth's reads they take (key k is
// read (k+1)^-1.1 times as often as key 0). ShareHotKeys counts one local
// hit in 16, so keys next in popularity may swap places at the fifth's
// edge; the share costs a stand-in only their difference, where a count of
// keys outside the fifth would treat it as a miss.
//
// Hot-key also measures how often and when values are replaced. Loads per
// soft TTL are the loads of its expiries over the time from the warm-up's
// value to the last expiry's end, in TTLs: 1 when each value is replaced
// once and lives a whole TTL. Each stale serve the Recorder noted, from the
// first expiry's end plus NearTTL on (RefreshAheadHot's tracker finds the
// key over the caches' first soft TTL), is set against the expiry event
// that ended it: one that came when no event was running, nor had ended
// within NearTTL (the time a replica takes to pick up a value another
// wrote), came before its refresh began; an event that stale serves came
// during, or within NearTTL after, is a late refresh: its value reached a
// replica only after the old one expired.
//
// Each layer's promises hold for it and every rung above it:
//
//	hot-key     coalescing: ≤ 1 load per replica per expiry; lease: 1 load per expiry;
//	            xfetch (and swr): no client waited after warm-up (on the xfetch rung
//	            itself, none that waited for a refresh no longer than the load before
//	            it plus XFetch's 20% margin, all that XFetch promises);
//	            ahead: ≤ 1.2 loads per soft TTL after warm-up, and every refresh began
//	            before its value expired (no stale serve before its refresh began)
//	flush       coalescing: ≤ 1 load per replica per key; lease: ≤ 1 load per key
//	cold-start  the same (cold and warm), and with warmup (every rung) no client waited
//	            on a warmed key; warm from the fleet (every rung: all share the remote
//	            tier): no backing-store call while warming, each replica holding every key
//	            of the hot set, keys that take ≥ 90% of the hottest fifth's reads
//	node-kill   coalescing: ≤ 1 load per replica per key per expiry while down, and no
//	            client error the backing store could have answered (shed requests aside)
//	everywhere  limiter: peak backing-store concurrency ≤ 4 per replica (cold-start: cold
//	            and warm)
//
// Each check records how many observations it judged and what they are:
// hot-key's the expiries; flush's and cold-start's the keys loaded (per
// replica, or fleet-wide) and the requests for warmed keys; node-kill's the
// loads and the requests while the node was down; the limiter's every
// backing-store call of the run; the fleet's the keys warmed and the
// replicas. A check that judged none fails, whatever it measured: a run
// too short for the key to expire, or an outage no key expired in, shows
// nothing. Warming from the fleet loads no key, so the promises that judge
// loads (per key, the limiter's) do not apply to it; each replica is
// judged against the keys its own WarmHot found in the hot set.
//
// The promises of coalescing and the lease assume that the remote tier
// answers. A run whose caches saw it fail (failed calls, writes fenced
// after a lease lapsed, lost leases, breaker openings: remote_failures)
// reports the failures with each of them, and one that did not hold is
// judged instead by what holds whatever Redis does: no two loads of one
// key overlapped on one replica. A busy machine can starve a lease holder
// past its lease's TTL; herd then fences its write and another replica
// loads, by design. The embedded store fails only in node-kill.
//
// Every run also reports how late its traffic's timers woke at most
// (timer_late_ms): how far behind the machine ran its goroutines, herd's
// timers among them. Refresh-ahead's timer fires about 1.2 load durations
// before a value expires; when the run's timers ran at least half that
// late, a stale serve before its refresh suspends the promise that every
// refresh began in time, and what is judged instead is that refreshes ran
// ahead.
//
// [Figures] lists the scenario-specific figures of Run.Extra with a label
// and a sentence each. Every run of a suite counts the backing-store calls
// it starts in buckets of one width (at most 120 over --duration), so the
// timelines of a suite compare, and records its scenario's events on the
// same clock (Run.Events: the measured expiries, the flush, the kill and
// restart, the start of traffic). In results.json durations and instants
// are in milliseconds, named with an _ms suffix.
//
// Refresh-ahead starts each refresh a load's duration plus a fifth before
// its value's soft expiry (the duration herd plans by: the larger of the
// last load's and nine tenths of the one before): about 1.05 loads per TTL
// where XFetch makes 1.3 to 1.5. A refresh whose load runs over 1.2× that
// duration still ends after the expiry, and a replica that has dropped the
// key from its hot set picks up the refreshed value at its next read, so
// late refreshes do serve some reads stale: the lab reports them and
// promises nothing there.
//
// For open-loop hot-key runs under none, coalescing and lease, [Predict]
// sets the formula (replicas × rate × mean recompute, replicas, 1) beside
// the measured calls per expiry, which must lie within a band of ±20%.
// Unprotected, the calls of an expiry are Poisson arrivals over a recompute
// of varying length, so the mean of the few expiries a --quick run measures
// varies by more than that: the band widens to three standard deviations of
// that mean, and the prediction says why and how many expiries ±20% needs.
// Only a preset's predictions are checks; one outside its band is noted on
// Options.Notes whether or not it is.
package lab
