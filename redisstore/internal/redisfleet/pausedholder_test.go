package redisfleet_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

// A holder that lost its lease: replica A reaches Redis through a relay
// that the test freezes while A loads, so that A's watchdog cannot extend
// its lease and the lease lapses; replica B then takes the key over, or
// fences A with a Set. Once A's load returns, its value may reach the
// callers that were waiting on that load, but no read on A that begins
// after A's lease could have lapsed may be served it from A's local tier:
// A's write of it is refused (or never lands), and B's value is the key's.
//
// HERD_PAUSES sets the number of pauses of each case (default 2); each
// takes about a second of real time, as the lease must lapse.

const (
	// pausedLeaseTTL is the lease TTL of both replicas: short, as the
	// lease must lapse in real time.
	pausedLeaseTTL = 300 * time.Millisecond
	// pausedTimeout is A's Redis call deadline: its calls through the
	// frozen relay fail at it.
	pausedTimeout = 100 * time.Millisecond
	// pausedReads is how many reads A makes after its load returned, while
	// frozen and once resumed.
	pausedReads = 5
	// pausedBound bounds every wait of a pause.
	pausedBound = 20 * time.Second
)

// relay forwards TCP connections from a loopback listener to a target, and
// can be frozen: while frozen it forwards no byte in either direction, and
// closes nothing, as a network partition or a paused process would.
type relay struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond // L is &mu; broadcast when frozen or closed changes
	frozen bool       // guarded by mu
	closed bool       // guarded by mu
	conns  []net.Conn // guarded by mu
	wg     sync.WaitGroup
}

// startRelay starts a relay to target, closed when the test ends.
func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Go(r.accept)
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) accept() {
	for {
		down, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		up, err := net.DialTimeout("tcp", r.target, pausedBound)
		if err != nil {
			_ = down.Close()
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = down.Close()
			_ = up.Close()
			return
		}
		r.conns = append(r.conns, down, up)
		r.mu.Unlock()
		r.wg.Go(func() { r.pump(up, down) })
		r.wg.Go(func() { r.pump(down, up) })
	}
}

// pump copies src to dst. What it reads while the relay is frozen it holds
// until the relay is resumed; it writes under mu, so that once freeze has
// returned no byte is forwarded.
func (r *relay) pump(dst, src net.Conn) {
	defer func() { _ = dst.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			r.mu.Lock()
			for r.frozen && !r.closed {
				r.cond.Wait()
			}
			var werr error
			if !r.closed {
				_, werr = dst.Write(buf[:n])
			}
			closed := r.closed
			r.mu.Unlock()
			if closed || werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// freeze stops all forwarding; resume starts it again.
func (r *relay) freeze() { r.set(true) }
func (r *relay) resume() { r.set(false) }

func (r *relay) set(frozen bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frozen = frozen
	r.cond.Broadcast()
}

func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	r.cond.Broadcast()
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	r.wg.Wait()
}

// writeSignal is a Remote that reports each of its writes of a load's value
// (WriteRelease) once Redis has answered it.
type writeSignal struct {
	*redisstore.Remote
	wrote chan bool
}

func (w *writeSignal) WriteRelease(ctx context.Context, key string, env []byte, fence uint64, ttl time.Duration, token string) (bool, error) {
	ok, err := w.Remote.WriteRelease(ctx, key, env, fence, ttl, token)
	if err == nil {
		select {
		case w.wrote <- ok:
		default:
		}
	}
	return ok, err
}

// pausedPauses is the number of pauses of each case: HERD_PAUSES, or 2.
func pausedPauses(t *testing.T) int {
	t.Helper()
	s := os.Getenv("HERD_PAUSES")
	if s == "" {
		return 2
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("HERD_PAUSES=%q: want a positive number of pauses", s)
	}
	return n
}

// pausedReplica is a replica over Remote r with the lease on.
func pausedReplica(t *testing.T, name string, r *redisstore.Remote, lease remote.Lease) *herd.Cache[string] {
	t.Helper()
	c, err := herd.New(&herd.Options[string]{
		NoBreaker:   true,
		Name:        name,
		MaxEntries:  100,
		SoftTTL:     time.Minute,
		Store:       r,
		Lease:       lease,
		LeaseTTL:    pausedLeaseTTL,
		OnLeaseHeld: herd.Wait,
		LeaseWait:   10 * time.Second,
		NearTTL:     time.Minute, // only a refused write or a notice can drop a local copy in time
		LoadTimeout: pausedBound,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), pausedBound)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// A holder whose lease lapsed while it was cut off from Redis, and whose
// key B then took over (loading a newer value) or fenced with a Set, does
// not serve its late value from its local tier to its own later reads.
func TestPausedHolderServesNotItsLateValue(t *testing.T) {
	n := pausedPauses(t)
	node := redistest.Server(t)
	for _, takeover := range []bool{true, false} {
		name := "B takes over"
		if !takeover {
			name = "B sets"
		}
		t.Run(name, func(t *testing.T) {
			failed := 0
			for i := range n {
				if bad := pause(t, node, fmt.Sprintf("paused%v-%d:", takeover, i), takeover); bad != "" {
					failed++
					t.Errorf("pause %d: %s", i, bad)
				}
			}
			if failed > 0 {
				t.Errorf("%s: in %d of %d pauses the resumed holder served its late value", name, failed, n)
			}
		})
	}
}

// pause runs one pause under prefix and returns what went wrong, if
// anything.
func pause(t *testing.T, node *redistest.Node, prefix string, takeover bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), pausedBound)
	defer cancel()
	rl := startRelay(t, node.Addr)
	clientA := redis.NewClient(&redis.Options{Addr: rl.addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = clientA.Close() })
	rA, err := redisstore.New(redisstore.Options{Client: clientA, Prefix: prefix, Timeout: pausedTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rA.Close() })
	rB, err := redisstore.New(redisstore.Options{Client: node.Client(), Prefix: prefix, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rB.Close() })
	wB := &writeSignal{Remote: rB, wrote: make(chan bool, 1)}
	a := pausedReplica(t, "A", rA, rA)
	b := pausedReplica(t, "B", rB, wB)
	key := herd.Key("paused")

	// A takes the lease and loads, its load held until released.
	started, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		v, err := a.Get(ctx, key, func(ctx context.Context) (string, error) {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			return "a-late", nil
		})
		if err == nil && v != "a-late" {
			err = fmt.Errorf("A's caller of its own load got %q", v)
		}
		held <- err
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("A never loaded")
	}
	rl.freeze()
	// No extension reaches Redis after this: A's lease lapses by then.
	lapse := time.Now().Add(pausedLeaseTTL)

	if takeover {
		// B waits out A's lease, takes it and loads the newer value.
		v, err := b.Get(ctx, key, func(context.Context) (string, error) { return "b", nil })
		if err != nil || v != "b" {
			t.Fatalf("B's Get = %q, %v; want its own load's b", v, err)
		}
		select {
		case ok := <-wB.wrote:
			if !ok {
				t.Fatal("B's write of its value was refused")
			}
		case <-ctx.Done():
			t.Fatal("B's write of its value never landed")
		}
	} else {
		if err := b.Set(ctx, key, "b"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(lapse)) // A's lease lapses: the real time is the point
	}
	// B's takeover proves the lease lapsed; the reads below begin after
	// the latest instant it could have.
	time.Sleep(time.Until(lapse))

	close(release)
	select {
	case err := <-held:
		if err != nil { // its callers may get the late value, or an error
			t.Logf("A's own Get, waiting on its load: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("A's own Get never returned")
	}
	var served []string
	read := func(phase string) {
		for range pausedReads {
			if v, ok := a.GetIfPresent(key); ok && v == "a-late" {
				served = append(served, phase+" GetIfPresent")
			}
			v, err := a.Get(ctx, key, func(context.Context) (string, error) { return "a-reader", nil })
			switch {
			case err != nil: // Redis is cut off, or just came back: no value served
				t.Logf("A's Get %s: %v", phase, err)
			case v == "a-late":
				served = append(served, phase+" Get")
			}
		}
	}
	read("frozen")
	rl.resume()
	read("resumed")
	if len(served) > 0 {
		return fmt.Sprintf("%d of %d reads on A begun after its lease lapsed were served its late value: %v", len(served), 4*pausedReads, served)
	}
	if v, err := b.Get(ctx, key, nil); err != nil || v != "b" {
		return fmt.Sprintf("B then serves %q, %v; want its b", v, err)
	}
	return ""
}
