package redisstore

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

// collect subscribes to r, with proofs when live, and returns the channel
// of what the subscription hands fn.
func collect(t *testing.T, r *Remote, live bool) <-chan remote.Notice {
	got := make(chan remote.Notice, 64)
	fn := func(n remote.Notice) { got <- n }
	var stop func()
	if live {
		stop = r.SubscribeLive(fn)
	} else {
		stop = r.Subscribe(fn)
	}
	t.Cleanup(stop)
	return got
}

// expect receives len(want) notices from got, in order, and fails the test
// unless they are want.
func expect(t *testing.T, got <-chan remote.Notice, want ...remote.Notice) {
	t.Helper()
	var ns []remote.Notice
	for range want {
		select {
		case n := <-got:
			ns = append(ns, n)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %v, then nothing for 10s; want %v", ns, want)
		}
	}
	if diff := cmp.Diff(want, ns); diff != "" {
		t.Fatalf("notices (-want +got):\n%s", diff)
	}
}

func beatAt(seq uint64, at time.Time) string {
	return "h" + strconv.FormatUint(seq, 10) + ":" + strconv.FormatInt(at.UnixMilli(), 10)
}

// TestHeardHeartbeats checks what SubscribeLive and Subscribe hand on from
// heartbeats: a proof, good for twice the period from the heartbeat's
// time, after each heartbeat that follows the one before it; the zero
// Notice first after a gap or a sequence that went back; no proof for a
// heartbeat made more than two periods ago; and nothing when LivePeriod is
// not set. The heartbeats are handed to the Remote directly; its own come
// an hour apart, after the test.
func TestHeardHeartbeats(t *testing.T) {
	const period = time.Hour
	node := redistest.Server(t)
	r := newRemote(t, node.Client(), Options{LivePeriod: period})
	live, plain := collect(t, r, true), collect(t, r, false)
	now := time.Now().Truncate(time.Millisecond)
	proof := func(at time.Time) remote.Notice { return remote.Notice{Live: at.Add(2 * period)} }

	r.heard(beatAt(5, now))
	r.heard(beatAt(6, now))
	expect(t, live, proof(now), proof(now))

	r.heard(beatAt(8, now)) // 7 was lost
	expect(t, live, remote.Notice{}, proof(now))
	expect(t, plain, remote.Notice{})

	r.heard(beatAt(3, now)) // the sequence key was lost
	expect(t, live, remote.Notice{}, proof(now))
	expect(t, plain, remote.Notice{})

	old := now.Add(-3 * period)
	r.heard(beatAt(4, old))                // too old to prove anything
	r.heard(beatAt(5, now))                // a proof again
	r.heard("h6:x")                        // ignored
	r.heard(beatAt(0, now))                // ignored: sequences start at 1
	r.heard(beatAt(6, now.Add(time.Hour))) // a server clock ahead: dated now
	expect(t, live, proof(now))
	n := <-live
	if n.Live.Before(now.Add(2*period)) || n.Live.After(time.Now().Add(2*period)) {
		t.Fatalf("proof of a heartbeat dated an hour ahead holds until %v, want at most 2 periods from now", n.Live)
	}

	off := newRemote(t, node.Client(), Options{})
	offLive := collect(t, off, true)
	off.heard(beatAt(1, now))
	off.heard(beatAt(3, now))
	off.dispatch(beatAt(5, now))
	off.dispatch("c1:k") // a change, to see that nothing came before it
	expect(t, offLive, remote.Notice{Key: "k", Fence: 1})
	select {
	case n := <-plain:
		t.Fatalf("Subscribe was handed %+v, want nothing more", n)
	default:
	}
}

// TestLivePeriodOptions checks that a negative LivePeriod is refused, and
// that a Cluster ignores it: no heartbeats, no proofs.
func TestLivePeriodOptions(t *testing.T) {
	if _, err := New(Options{Client: redistest.Server(t).Client(), LivePeriod: -time.Second}); err == nil || !strings.Contains(err.Error(), "LivePeriod") {
		t.Errorf("New with a negative LivePeriod: %v, want an error naming it", err)
	}
	r := newRemote(t, redistest.Cluster(t).Client(), Options{LivePeriod: time.Millisecond})
	if r.livePeriod != 0 || r.beating != nil {
		t.Errorf("a Remote over a Cluster has LivePeriod %v (beating %v), want it off", r.livePeriod, r.beating != nil)
	}
}

// FuzzParseLive checks that parseLive ends, accepts only canonical
// heartbeats, and gives back what it parsed.
func FuzzParseLive(f *testing.F) {
	for _, seed := range []string{"", "h", "h1", "h1:", "h:1", "h1:1", "h01:1", "h1:01", "h0:1", "h1:0", "h-1:1", "h+1:1",
		"h9007199254740991:1", "h9007199254740992:1", "h1:1:1", "h18446744073709551616:1", "c1:k", "h1:1700000000000"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p string) {
		seq, ms, ok := parseLive(p)
		if !ok {
			return
		}
		if seq == 0 || ms == 0 {
			t.Fatalf("parseLive(%q) = %d, %d: zero", p, seq, ms)
		}
		if back := "h" + strconv.FormatUint(seq, 10) + ":" + strconv.FormatUint(ms, 10); back != p {
			t.Fatalf("parseLive(%q) = %d, %d, which formats as %q", p, seq, ms, back)
		}
	})
}
