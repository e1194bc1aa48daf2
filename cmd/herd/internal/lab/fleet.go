package lab

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/remote"
)

// Cold-start's fleet variant.
const (
	// minSharePeriod is the shortest period of the hot set (see
	// sharePeriod): long enough for the veteran's reads of a period on a
	// busy machine.
	minSharePeriod = 100 * time.Millisecond
	// veteranReads is how many reads the veteran makes per period: enough
	// for ShareHotKeys, which counts one local hit in 16, to rank the
	// hottest fifth of the keys (see minWarmReadShare).
	veteranReads = 20_000
	// veteranBatches: the veteran's reads of a period come in this many
	// batches, evenly spread.
	veteranBatches = 40
)

// fleetWarm is what cold-start's fleet variant recorded before traffic.
type fleetWarm struct {
	// veteranReads counts the veteran's reads, veteranErrors those that
	// failed.
	veteranReads, veteranErrors int
	// hotKeys is the fleet's hot set when the replicas warmed, most read
	// first; empty when it stayed empty until the wait gave up.
	hotKeys []int
	// report sums every replica's WarmHot report (Errors left out);
	// errors counts the WarmHot calls that failed.
	report herd.WarmReport
	errors int
	// warmed holds, per replica, the keys its local tier held once it had
	// warmed, and found how many keys its WarmHot found fresh in the Store.
	warmed [][]int
	found  []int
}

// errVeteranLoad is what the veteran's loads return: every value of the
// running fleet is in the Store, so a load would be a backing-store call
// that no replica warming made.
var errVeteranLoad = errors.New("lab: the veteran does not load")

// warmFromFleet runs cold-start's fleet variant up to its traffic. A
// running fleet keeps every key's value in the Store, written without a
// backing-store call by a cache that shares no hot keys; a veteran of that
// fleet, a cache on replica 0's connection, reads the keys with their Zipf
// popularity from its start until its ShareHotKeys has added its hot keys
// to the Store's hot set at the end of its first period, and for one period
// more. Then every replica, empty, calls WarmHot for the hottest fifth
// before it takes traffic. A hot set still empty three periods and a
// client timeout after the veteran started is recorded as such, and the
// replicas take traffic cold.
func (e *runEnv) warmFromFleet(ctx context.Context) error {
	hs, ok := e.reps[0].store.(remote.HotSet)
	if !ok {
		return errors.New("the remote tier keeps no hot set")
	}
	so := e.cacheOptions(e.reps[0])
	so.ShareHotKeys = 0
	seeder, err := herd.New(so)
	if err != nil {
		return err
	}
	err = e.seed(ctx, seeder, false)
	if cerr := seeder.Close(ctx); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}

	f := &fleetWarm{}
	e.fleet = f
	vo := e.cacheOptions(e.reps[0])
	vo.Load = func(context.Context, string) (string, error) { return "", errVeteranLoad }
	vet, err := herd.New(vo)
	if err != nil {
		return err
	}
	e.veteran = vet
	period := e.sharePeriod()
	vctx, cancel := context.WithTimeout(ctx, 3*period+e.o.ClientTimeout)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { f.veteranReads, f.veteranErrors = e.veteranTraffic(vctx, vet, stop) })
	stopVeteran := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopVeteran()
	f.hotKeys = e.waitHot(vctx, hs)
	// The first share may count only part of a period of reads (fewer
	// still on a busy machine): read the set again once a whole period
	// more has been shared.
	if len(f.hotKeys) > 0 && sleepUntil(vctx, e.origin, e.origin.Since()+period+period/10) {
		if keys := e.waitHot(vctx, hs); len(keys) > 0 {
			f.hotKeys = keys
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	e.warmFrom = e.origin.Since()
	if len(f.hotKeys) == 0 {
		return nil
	}
	wctx, wcancel := context.WithTimeout(ctx, 4*e.o.ClientTimeout)
	defer wcancel()
	f.warmed = make([][]int, len(e.reps))
	f.found = make([]int, len(e.reps))
	var mu sync.Mutex
	var warmers sync.WaitGroup
	for i, r := range e.reps {
		warmers.Go(func() {
			c := r.cache.Load()
			rep, err := c.WarmHot(wctx, e.hot, nil)
			var held []int
			for k, key := range e.keys {
				if _, ok := c.GetIfPresent(key); ok {
					held = append(held, k)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				f.errors++
			}
			f.report.Loaded += rep.Loaded
			f.report.Fresh += rep.Fresh
			f.report.Failed += rep.Failed
			f.warmed[i], f.found[i] = held, rep.Fresh
		})
	}
	warmers.Wait()
	stopVeteran()
	e.warmFailed = f.report.Failed
	return nil
}

// sharePeriod is the period of the hot set in cold-start's fleet variant,
// ShareHotKeysEvery: a twentieth of the run and at least minSharePeriod,
// so that the veteran's first period ends early in it (the soft TTL, the
// default period, is ten runs long).
func (e *runEnv) sharePeriod() time.Duration {
	return max(e.o.Duration/20, minSharePeriod)
}

// veteranTraffic has c read keys picked with their Zipf popularity,
// veteranReads per period in evenly spread batches (catching up when it
// falls behind), until stop is closed or ctx ends. It returns how many
// reads it made and how many failed.
func (e *runEnv) veteranTraffic(ctx context.Context, c *herd.Cache[string], stop <-chan struct{}) (reads, failed int) {
	pick := e.picker(e.rng(0)) // stream 0 serves no other purpose
	gap := e.sharePeriod() / veteranBatches
	start := e.origin.Since()
	for i := 1; ; i++ {
		for range veteranReads / veteranBatches {
			if _, err := c.Get(ctx, e.keys[pick()], nil); err != nil {
				failed++
			}
			reads++
		}
		select {
		case <-stop:
			return reads, failed
		default:
		}
		if !sleepUntil(ctx, e.origin, start+time.Duration(i)*gap) {
			return reads, failed
		}
	}
}

// waitHot polls the fleet's hot set, every twentieth of a period, until it
// holds keys, and returns their indices, the most read first; nil when ctx
// ends first. One veteran fills it in one AddHot, so the first keys seen
// are the whole set.
func (e *runEnv) waitHot(ctx context.Context, hs remote.HotSet) []int {
	period := e.sharePeriod()
	for {
		keys, err := hs.Hot(ctx, e.hot, period)
		if err == nil && len(keys) > 0 {
			idx := make([]int, len(keys))
			for i, k := range keys {
				idx[i] = keyIndex(k)
			}
			return idx
		}
		if !sleepUntil(ctx, e.origin, e.origin.Since()+max(period/20, time.Millisecond)) {
			return nil
		}
	}
}

// keyIndex returns the index of a key of the lab ("k12": 12), -1 for any
// other string.
func keyIndex(key string) int {
	if len(key) < 2 || key[0] != 'k' {
		return -1
	}
	i, err := strconv.Atoi(key[1:])
	if err != nil || i < 0 {
		return -1
	}
	return i
}
