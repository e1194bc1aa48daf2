package redisfleet_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/keyspace"
)

const (
	earlyReplicas = 20
	earlySoft     = 2 * time.Second
	earlyLoad     = 250 * time.Millisecond // the database
	// earlyRun is the traffic offered per run: more than ten soft TTLs.
	earlyRun = 21 * time.Second
	// earlyBound is the loads per TTL fleet-wide that early refresh at
	// Beta 1 must stay within.
	earlyBound = 1.25
)

// BenchmarkFleetEarlyRefresh measures what herd's early refresh costs a
// fleet: 20 replicas over one redis-server, the lease on, read one hot key
// at rate Gets a second each for earlyRun, with SoftTTL 2s, a 250ms load
// and Beta 1 (a lead decided once per value, alike on every replica). It
// runs with an 8s stale window (HardTTL 10s, losers served stale) and with
// none (HardTTL = SoftTTL, losers wait), and reports:
//
//   - loads/TTL: the loads after the cold one, per soft TTL from the cold
//     load's end to the end of the traffic; the bound is 1.25;
//   - origin-waits: the Gets served a value whose load ended after they
//     began, so that they waited for a load (theirs, or another caller's
//     or replica's);
//   - redis-waits: the Gets that waited on a Store read (Stats.RemoteWaits);
//   - every Get's latency percentiles, as BenchmarkTailLatency reports them.
//
// Over the bound, it logs each load: the replica that ran it, when it began
// relative to the soft expiry of the value it replaced, how long it took,
// and the lease calls since the previous load. Over about ten and a half
// TTLs a run's loads/TTL moves in steps of about 0.095: 13 loads is 1.24,
// 14 is 1.33. It is one run per iteration:
// go test -run '^$' -bench FleetEarlyRefresh -benchtime 1x.
func BenchmarkFleetEarlyRefresh(b *testing.B) {
	for _, rate := range []int{50, 500} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			for _, hard := range []time.Duration{10 * time.Second, earlySoft} {
				b.Run(fmt.Sprintf("stale=%v", hard-earlySoft), func(b *testing.B) {
					for b.Loop() {
						earlyRefreshRun(b, rate, hard)
					}
				})
			}
		})
	}
}

// earlyRefreshRun is one run of BenchmarkFleetEarlyRefresh on a server of
// its own.
func earlyRefreshRun(b *testing.B, rate int, hard time.Duration) {
	node := redistest.Server(b)
	key := herd.Key("hot", "early")
	n := names(b, key)
	log := &expiryLog{}
	calls := &leaseCalls{}
	clients := 0
	rs := fleet(b, earlyReplicas, func() redis.UniversalClient {
		c := node.Client()
		i := clients // fleet makes replica i's client i-th
		clients++
		c.AddHook(&roundTrips{done: func(cmd redis.Cmder, _ time.Duration, err error) {
			log.command(cmd, n, err)
			calls.command(i, cmd, n)
		}})
		return c
	}, func(o *herd.Options[string]) {
		o.SoftTTL, o.HardTTL = earlySoft, hard
		o.Beta = 1
		o.NearTTL = time.Second
		o.RefreshBackoff = time.Second
		if hard > earlySoft {
			o.OnLeaseHeld = herd.ServeStale
		}
		o.Recorder = log
	})
	loads := make([]herd.LoadFunc[string], len(rs))
	for i := range loads {
		// The value is the instant its load returned, so that a reader
		// knows whether it waited for that load.
		loads[i] = func(ctx context.Context) (string, error) {
			start := time.Now()
			select {
			case <-time.After(earlyLoad):
			case <-ctx.Done():
				log.load(i, start, time.Now(), false, earlyLoad)
				return "", ctx.Err()
			}
			end := time.Now()
			log.load(i, start, end, true, earlyLoad)
			return strconv.FormatInt(end.UnixNano(), 10), nil
		}
	}
	var reads, originWaits atomic.Int64
	gets := make([]func(context.Context) error, len(rs))
	for i, r := range rs {
		gets[i] = func(ctx context.Context) error {
			t0 := time.Now()
			v, err := r.cache.Get(ctx, key, loads[i])
			if err != nil {
				return err
			}
			end, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("hot value %q: %w", v, err)
			}
			reads.Add(1)
			if end > t0.UnixNano() {
				originWaits.Add(1)
			}
			return nil
		}
	}

	// The cold load fills Redis, every replica reads it once.
	warm(b, gets)
	cold := log.spans()
	if len(cold) != 1 {
		b.Fatalf("warming the fleet made %d loads, want the one cold load", len(cold))
	}
	if n := originWaits.Load(); n != 1 {
		b.Fatalf("%d warming Gets were counted as waiting for a load, want the cold one alone", n)
	}
	from := cold[0].end
	reads.Store(0)
	originWaits.Store(0)
	before := make([]observe.Stats, len(rs))
	for i, r := range rs {
		before[i] = r.cache.Stats()
	}
	log.begin(time.Now())
	lat := openLoop(b, gets, rate, earlyRun)
	stop := time.Now()
	// Close waits for the refreshes still running, so that their loads are
	// logged; only those begun before stop count.
	var waited int64
	for i, r := range rs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := r.cache.Close(ctx); err != nil {
			b.Errorf("closing replica %d: %v", i, err)
		}
		cancel()
		waited += r.cache.Stats().RemoteWaits - before[i].RemoteWaits
	}

	var after []loadSpan
	for _, s := range log.spans()[1:] {
		if s.start.Before(stop) {
			after = append(after, s)
		}
	}
	run := stop.Sub(from)
	switch {
	case reads.Load() == 0:
		b.Fatalf("no Get was served in %v of traffic: nothing judged", run)
	case len(after) == 0:
		b.Fatalf("no load after the cold one in %v of traffic: nothing judged", run)
	case run < 10*earlySoft:
		b.Fatalf("%v of traffic, want at least ten soft TTLs (%v)", run, 10*earlySoft)
	}
	report(b, lat, len(after), run, earlySoft)
	b.ReportMetric(float64(originWaits.Load()), "origin-waits")
	b.ReportMetric(float64(waited), "redis-waits")
	if per := float64(len(after)) / (float64(run) / float64(earlySoft)); per > earlyBound {
		b.Logf("%.2f loads per TTL over %v, above the %.2f bound:", per, run.Round(time.Millisecond), earlyBound)
		logLoads(b, cold[0], after, calls.all(), log.troubles(stop))
	}
}

// logLoads logs, in a few lines (a benchmark's log is cut at ten), what
// each load after the cold one was: the replica that ran it; when it began
// relative to the soft expiry of the newest value loaded before it began
// (negative: early, by that much), how long it took, and whether another
// load ran then; and the acquire calls on the key sent since the previous
// load began, by outcome, with the replicas granted the lease.
func logLoads(b *testing.B, cold loadSpan, after []loadSpan, calls []leaseCall, trouble int) {
	newest, prevStart := cold, cold.start
	var replicas, offsets, grantees, overlaps []string
	took := []string{cold.end.Sub(cold.start).Round(time.Millisecond).String()}
	var outcomes [4]int
	past := 0
	for k, s := range after {
		var granted []string
		for _, c := range calls {
			if c.at.Before(prevStart) || !c.at.Before(s.start) {
				continue
			}
			outcomes[c.outcome]++
			if c.outcome == acquireGranted {
				granted = append(granted, strconv.Itoa(c.replica))
			}
		}
		off := s.start.Sub(newest.end.Add(earlySoft))
		if off >= 0 {
			past++
		}
		if s.start.Before(newest.end) {
			overlaps = append(overlaps, fmt.Sprintf("load %d (replica %d) began during replica %d's", k+1, s.replica, newest.replica))
		}
		replicas = append(replicas, strconv.Itoa(s.replica))
		offsets = append(offsets, off.Round(time.Millisecond).String())
		took = append(took, s.end.Sub(s.start).Round(time.Millisecond).String())
		grantees = append(grantees, "["+strings.Join(granted, " ")+"]")
		if s.ok && s.end.After(newest.end) {
			newest = s
		}
		prevStart = s.start
	}
	b.Logf("  the replica of each load: %s", strings.Join(replicas, " "))
	b.Logf("  each load's start from the soft expiry of the newest value (negative: early): %s; %d began at or past it", strings.Join(offsets, " "), past)
	b.Logf("  each load's duration, the cold one's first (the next value's lead is that delta×(1.2+E), E drawn once per value): %s", strings.Join(took, " "))
	if len(overlaps) == 0 {
		overlaps = append(overlaps, "none")
	}
	b.Logf("  loads begun while another ran: %s", strings.Join(overlaps, "; "))
	b.Logf("  acquire calls on the key up to the last load: %d granted, %d found a fresh value, %d found it held, %d failed; granted, per load, to: %s",
		outcomes[acquireGranted], outcomes[acquireFound], outcomes[acquireHeld], outcomes[0], strings.Join(grantees, " "))
	b.Logf("  failed Redis calls, lost leases, opened breakers and loads of twice the load time, before the end of the traffic: %d", trouble)
}

// spans returns the loads logged so far, by start.
func (l *expiryLog) spans() []loadSpan {
	l.mu.Lock()
	s := slices.Clone(l.loads)
	l.mu.Unlock()
	slices.SortFunc(s, func(a, b loadSpan) int { return a.start.Compare(b.start) })
	return s
}

// troubles returns how many failed Redis calls, lost leases, opened
// breakers and slow loads were logged before stop.
func (l *expiryLog) troubles(stop time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.trouble {
		if at.Before(stop) {
			n++
		}
	}
	return n
}

// leaseCalls records the acquire calls on one key, each with the replica
// that sent it and its outcome. Safe for concurrent use.
type leaseCalls struct {
	mu    sync.Mutex
	calls []leaseCall
}

type leaseCall struct {
	replica int
	at      time.Time // when the reply came
	outcome int64     // acquireFound, acquireGranted, acquireHeld; 0: failed
}

func (l *leaseCalls) command(replica int, cmd redis.Cmder, n keyspace.Names) {
	if !isAcquire(cmd, n) {
		return
	}
	c := leaseCall{replica: replica, at: time.Now(), outcome: acquireOutcome(cmd)}
	if c.outcome < 0 || c.outcome > acquireHeld {
		c.outcome = 0 // not a reply the script gives
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

func (l *leaseCalls) all() []leaseCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}
