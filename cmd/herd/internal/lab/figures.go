package lab

// Figure describes one scenario-specific figure of [Run.Extra].
type Figure struct {
	// Key is the figure's name in Run.Extra and results.json.
	Key string
	// Label is its name for people, e.g. "calls while Redis is down".
	Label string
	// Doc says in one sentence what it counts.
	Doc string
}

// Figures lists every figure a run may report in Extra, in the order a
// report shows them. The remote tier is called Redis, which the embedded
// store stands for.
var Figures = []Figure{
	// hot-key
	{"max_calls_per_expiry", "max calls in one expiry",
		"the most backing-store calls of any one expiry event after warm-up, fleet-wide (failed calls aside)"},
	{"max_calls_per_replica_per_expiry", "max calls per replica in one expiry",
		"the most backing-store calls one replica made in any one expiry event (failed calls aside)"},
	{"loads_per_ttl", "loads per soft TTL",
		"loads of the expiries after warm-up per soft TTL of time: 1 when each value is replaced once and lives a whole TTL"},
	{"stale_before_refresh", "stale serves before their refresh began",
		"stale values served when no refresh was running nor had just ended: the refresh began only after its value expired"},
	{"late_refreshes", "late refreshes",
		"refreshes whose value reached some replica only after the old one had expired (stale serves came during them)"},
	{"ahead_refreshes", "refreshes ahead of expiry",
		"refreshes refresh-ahead started on its timer before the value's soft expiry (Stats.AheadRefreshes)"},
	// flush and cold-start
	{"keys_loaded", "keys loaded",
		"keys loaded at least once after the flush (flush) or the start (cold-start)"},
	{"max_calls_per_key", "max calls per key",
		"the most backing-store calls for one key after the flush or the start, fleet-wide (failed calls aside)"},
	{"max_calls_per_replica_per_key", "max calls per replica per key",
		"the most backing-store calls one replica made for one key after the flush or the start (failed calls aside)"},
	{"waited_on_warmed_keys", "requests that waited on a warmed key",
		"requests for a key the replica had warmed whose answer still waited for a backing-store call"},
	{"warm_calls", "calls while warming",
		"backing-store calls that started while the replicas warmed, before traffic"},
	{"warm_failed", "keys that failed to warm",
		"keys whose warming failed, over every replica"},
	{"veteran_reads", "veteran's reads",
		"reads a cache of the running fleet made, with the keys' popularity, to fill the fleet's hot set"},
	{"veteran_errors", "veteran's failed reads",
		"reads of that cache that failed"},
	{"hot_set_keys", "keys in the fleet's hot set",
		"keys the Store's hot set held when the replicas warmed from it"},
	{"warmed_keys", "keys warmed (worst replica)",
		"keys the local tier of the replica holding the fewest held once WarmHot returned"},
	{"warmed_hottest", "hottest keys warmed (worst replica)",
		"how many of the hottest fifth of the keys the worst replica warmed"},
	{"warmed_read_share", "share of the hottest fifth's reads warmed (worst replica)",
		"the share of the reads of the hottest fifth that the keys the worst replica warmed take (1 = exactly those keys)"},
	{"warm_errors", "failed WarmHot calls",
		"WarmHot calls that returned an error"},
	// node-kill
	{"down_ms", "time Redis was down (ms)",
		"milliseconds from the kill to the restart"},
	{"requests_while_down", "requests while Redis is down",
		"client requests that began while the node was down"},
	{"calls_while_down", "calls while Redis is down",
		"backing-store calls that began while the node was down: each replica loading on its own"},
	{"max_calls_per_replica_per_key_per_expiry_while_down", "max calls per replica per key per expiry while Redis is down",
		"the most backing-store calls one replica made for one key in one expiry event while the node was down (failed calls aside)"},
	{"avoidable_errors", "errors the backing store could have answered",
		"requests that failed for another reason than being shed or a failed backing-store call (a timeout, an error of the remote tier)"},
	// every scenario
	{"remote_failures", "Redis failures",
		"failed calls to the remote tier, writes fenced after a lease lapsed, leases lost and breaker openings, over the run's caches: herd degrades then, and the promises of coalescing and the lease are judged by what holds whatever Redis does"},
	{"timer_late_ms", "traffic timers' lateness (ms)",
		"the most the lab's traffic timers woke after their time: how far behind this machine ran the run's goroutines (a busy machine runs them late, and herd's timers with them)"},
	// slow-origin
	{"db_p99_ms", "database p99 (ms)", "the 99th percentile of the database calls' durations over the whole run"},
	{"db_p99_overload_ms", "database p99 while overloaded (ms)",
		"the 99th percentile of the durations of database calls started in the healthy and recovered phases, past their first quarter"},
	{"db_p99_slow_ms", "database p99 while 5× slower (ms)", "the 99th percentile of the durations of database calls started in the slow phase"},
	{"db_healthy_p99_ms", "healthy database p99 (ms)",
		"the 99th percentile of the database's latency at or below its capacity: as drawn, or as measured over every rung's calls that found it so, when that is more"},
	{"db_mean_inflight", "mean database calls in flight while overloaded",
		"the time-weighted mean of the database calls in flight in the healthy and recovered phases, past their first quarter"},
	{"goodput", "goodput (requests/s)", "requests answered within their client timeout, per second of the run"},
	{"goodput_healthy_pct", "answered in time while healthy (%)", "the share of requests started in the healthy phase (the first 40% of the run) answered within their client timeout"},
	{"goodput_slow_pct", "answered in time while 5× slower (%)", "the share of requests started in the slow phase (40% to 70% of the run) answered within their client timeout"},
	{"goodput_recovered_pct", "answered in time after recovery (%)", "the share of requests started in the recovered phase (the last 30% of the run) answered within their client timeout"},
	{"shed_latency", "shed by latency",
		"calls the limiters shed because the database's latency or the queue's wait was above ShedLatency (limiter.Stats.ShedLatency; the adaptive rung only)"},
	// limiter and above
	{"peak_per_replica", "peak calls in flight per replica",
		"the most backing-store calls one replica had in flight at once (the limiter caps it)"},
}

// FigureOf returns the description of the figure named key; for a key
// [Figures] does not list, one whose label is the key itself.
func FigureOf(key string) Figure {
	for _, f := range Figures {
		if f.Key == key {
			return f
		}
	}
	return Figure{Key: key, Label: key}
}
