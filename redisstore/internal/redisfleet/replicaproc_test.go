package redisfleet_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/observe"
	"github.com/herdcache/herd/redisstore"
	"github.com/herdcache/herd/redisstore/internal/redistest"
)

// A replica process is this test binary run again with replicaEnv set, so
// that TestMain runs replicaMain instead of the tests. It serves one herd cache over
// redisstore and is driven over its stdin and stdout, one line each way per
// message, every line starting with the request's id:
//
//	<id> get <key> <value> <mode> <callers> <recompute>
//	    callers Gets of key at once, whose load returns value; mode is load
//	    (the load takes recompute), gate (the load waits for "open <id>") or
//	    none (no load may run). Replies "<id> load" when a load starts, its
//	    count already in Redis, then "<id> ok <loads> <value>" once every
//	    caller was served value, or "<id> err <message>".
//	<id> open <get id>
//	    lets the gated load of that get return.
//	<id> stats
//	    replies "<id> stats <observe.Stats as JSON>".
//
// The replica says "0 ready" once its cache is made, and exits when its
// stdin ends.

// replicaEnv holds a replica process's replicaConfig as JSON.
const replicaEnv = "HERD_FLEET_REPLICA"

// replicaConfig is what a replica process is started with.
type replicaConfig struct {
	Name   string // the cache's name, and its field in Counts
	Addr   string // the redis-server, 127.0.0.1:<port>
	Prefix string // the cache's Redis key prefix
	// Counts is a Redis hash outside Prefix: each load adds 1 to the
	// replica's field before it announces itself.
	Counts   string
	SoftTTL  time.Duration
	LeaseTTL time.Duration
}

// Bounds of the parent's waits on its replicas, far above what a loaded
// machine needs.
const (
	replyWithin = 30 * time.Second
	readyWithin = 60 * time.Second // a race-instrumented binary starting on a busy machine
	exitWithin  = 15 * time.Second
	pollEvery   = 5 * time.Millisecond
)

// serveReplica runs a replica process's cache until in ends.
func serveReplica(cfg replicaConfig, in io.Reader, out io.Writer) error {
	client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{cfg.Addr}})
	defer client.Close()
	// The same options as the in-process fleet: a generous Redis deadline,
	// so that a loaded machine does not turn into a Redis outage.
	remote, err := redisstore.New(redisstore.Options{Client: client, Prefix: cfg.Prefix, Timeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer remote.Close()
	cache, err := herd.New(&herd.Options[string]{
		Name:             cfg.Name,
		MaxEntries:       1000,
		SoftTTL:          cfg.SoftTTL,
		Store:            remote,
		Lease:            remote,
		LeaseTTL:         cfg.LeaseTTL,
		OnLeaseHeld:      herd.Wait,
		LeaseWait:        10 * time.Second,
		NearTTL:          100 * time.Millisecond,
		BreakerThreshold: 3,
		BreakerCooldown:  200 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	s := &replicaServer{cfg: cfg, cache: cache, client: client, out: out, gates: map[int]chan struct{}{}, quit: make(chan struct{})}
	s.reply(0, "ready", "")
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		s.handle(sc.Text())
	}
	close(s.quit)
	s.running.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(sc.Err(), cache.Close(ctx))
}

// replicaServer is the replica's side of the line protocol.
type replicaServer struct {
	cfg    replicaConfig
	cache  *herd.Cache[string]
	client redis.UniversalClient

	outMu sync.Mutex
	out   io.Writer

	gates   map[int]chan struct{} // by get id; only the read loop uses it
	quit    chan struct{}         // closed when stdin ends: gated loads give up
	running sync.WaitGroup        // the gets being served
}

// reply writes one line to the parent.
func (s *replicaServer) reply(id int, kind, rest string) {
	line := strings.ReplaceAll(fmt.Sprintf("%d %s %s", id, kind, rest), "\n", " ")
	s.outMu.Lock()
	defer s.outMu.Unlock()
	fmt.Fprintln(s.out, line)
}

// handle serves one request line.
func (s *replicaServer) handle(line string) {
	f := strings.Fields(line)
	if len(f) < 2 {
		s.reply(0, "err", "bad command "+strconv.Quote(line))
		return
	}
	id, err := strconv.Atoi(f[0])
	if err != nil {
		s.reply(0, "err", "bad command "+strconv.Quote(line))
		return
	}
	switch {
	case f[1] == "get" && len(f) == 7:
		callers, err1 := strconv.Atoi(f[5])
		recompute, err2 := time.ParseDuration(f[6])
		if err := errors.Join(err1, err2); err != nil || callers < 1 {
			s.reply(id, "err", "bad command "+strconv.Quote(line))
			return
		}
		s.get(id, f[2], f[3], f[4], callers, recompute)
	case f[1] == "open" && len(f) == 3:
		target, _ := strconv.Atoi(f[2])
		gate, ok := s.gates[target]
		if !ok {
			s.reply(id, "err", "no gated get "+f[2])
			return
		}
		delete(s.gates, target)
		close(gate)
	case f[1] == "stats" && len(f) == 2:
		b, err := json.Marshal(s.cache.Stats())
		if err != nil {
			s.reply(id, "err", err.Error())
			return
		}
		s.reply(id, "stats", string(b))
	default:
		s.reply(id, "err", "bad command "+strconv.Quote(line))
	}
}

// get serves a get request on its own goroutine.
func (s *replicaServer) get(id int, key, value, mode string, callers int, recompute time.Duration) {
	var gate chan struct{}
	if mode == "gate" {
		gate = make(chan struct{})
		s.gates[id] = gate
	}
	var loads atomic.Int64
	load := func(ctx context.Context) (string, error) {
		if mode == "none" {
			return "", errors.New("a load ran where the value should have been served")
		}
		loads.Add(1)
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.client.HIncrBy(cctx, s.cfg.Counts, s.cfg.Name, 1).Err()
		cancel()
		if err != nil {
			return "", fmt.Errorf("counting the load: %w", err)
		}
		s.reply(id, "load", "")
		if gate == nil {
			t := time.NewTimer(recompute) // the backing store's work
			defer t.Stop()
			select {
			case <-t.C:
				return value, nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		select {
		case <-gate:
			return value, nil
		case <-s.quit:
			return "", errors.New("replica stopping")
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		got := make([]string, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), replyWithin)
				defer cancel()
				got[i], errs[i] = s.cache.Get(ctx, key, load)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			s.reply(id, "err", err.Error())
			return
		}
		for _, v := range got {
			if v != got[0] {
				s.reply(id, "err", fmt.Sprintf("callers were served different values: %q", got))
				return
			}
		}
		s.reply(id, "ok", fmt.Sprintf("%d %s", loads.Load(), got[0]))
	}()
}

// replicaProc is the parent's handle on a replica process.
type replicaProc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stderr bytes.Buffer // read once exited is closed
	ready  chan struct{}
	exited chan struct{} // closed once stdout has ended and the process has exited
	err    error         // the process's exit; set before exited is closed

	wmu   sync.Mutex // serialises writes to stdin
	stdin io.WriteCloser

	mu     sync.Mutex
	next   int
	calls  map[int]*procCall
	noise  []string // output lines that are not replies
	killed bool
}

// procCall is one request to a replica.
type procCall struct {
	p      *replicaProc
	id     int
	loaded chan struct{} // closed when the replica announces a load
	done   chan reply    // the final reply
	seen   bool          // loaded is closed; only the reader uses it
}

type reply struct{ kind, rest string }

// startProc starts a replica process. It is stopped when the test ends:
// asked to exit and killed if it does not, or killed at once if the test
// failed.
func startProc(t *testing.T, cfg replicaConfig) *replicaProc {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), replicaEnv+"="+string(raw))
	p := &replicaProc{t: t, name: cfg.Name, cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{}), calls: map[int]*procCall{}}
	cmd.Stderr = &p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting replica %s: %v", cfg.Name, err)
	}
	go p.read(stdout)
	t.Cleanup(p.stop)
	return p
}

// read dispatches the replica's replies until its stdout ends, then waits
// for the process.
func (p *replicaProc) read(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20) // stats replies are long lines
	for sc.Scan() {
		line := sc.Text()
		idText, rest, _ := strings.Cut(line, " ")
		kind, rest, _ := strings.Cut(rest, " ")
		id, err := strconv.Atoi(idText)
		p.mu.Lock()
		c := p.calls[id]
		switch {
		case err == nil && id == 0 && kind == "ready":
			close(p.ready)
		case c != nil && kind == "load":
			if !c.seen {
				c.seen = true
				close(c.loaded)
			}
		case c != nil:
			delete(p.calls, id)
			c.done <- reply{kind, rest}
		default:
			p.noise = append(p.noise, line)
		}
		p.mu.Unlock()
	}
	p.err = p.cmd.Wait()
	p.mu.Lock()
	for id, c := range p.calls {
		delete(p.calls, id)
		c.done <- reply{"err", fmt.Sprintf("replica exited (%v)", p.err)}
	}
	p.mu.Unlock()
	close(p.exited)
}

// waitReady waits until the replica's cache is made.
func (p *replicaProc) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-p.ready:
	case <-p.exited:
		t.Fatalf("replica %s exited before it was ready: %v\n%s", p.name, p.err, p.output())
	case <-time.After(readyWithin):
		t.Fatalf("replica %s not ready within %v", p.name, readyWithin)
	}
}

// send writes one request and returns it.
func (p *replicaProc) send(t *testing.T, format string, args ...any) *procCall {
	t.Helper()
	p.mu.Lock()
	p.next++
	c := &procCall{p: p, id: p.next, loaded: make(chan struct{}), done: make(chan reply, 1)}
	p.calls[c.id] = c
	p.mu.Unlock()
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if _, err := fmt.Fprintf(p.stdin, "%d "+format+"\n", append([]any{c.id}, args...)...); err != nil {
		t.Fatalf("writing to replica %s: %v", p.name, err)
	}
	return c
}

// Modes of a get: how its load, if one runs, behaves.
const (
	loadFor = "load" // the load takes recompute
	gated   = "gate" // the load waits for open
	noLoad  = "none" // no load may run: the value must be served
)

// get asks the replica for callers Gets of key at once.
func (p *replicaProc) get(t *testing.T, key, value, mode string, callers int, recompute time.Duration) *procCall {
	t.Helper()
	if strings.ContainsAny(key+value, " \n") || key == "" || value == "" {
		t.Fatalf("key %q and value %q must be words", key, value)
	}
	return p.send(t, "get %s %s %s %d %s", key, value, mode, callers, recompute)
}

// open lets c's gated load return.
func (p *replicaProc) open(t *testing.T, c *procCall) {
	t.Helper()
	p.send(t, "open %d", c.id)
}

// stats returns the replica's Stats.
func (p *replicaProc) stats(t *testing.T) observe.Stats {
	t.Helper()
	r := p.send(t, "stats").wait(t)
	var s observe.Stats
	if r.kind != "stats" {
		t.Fatalf("replica %s: stats: %s %s", p.name, r.kind, r.rest)
	}
	if err := json.Unmarshal([]byte(r.rest), &s); err != nil {
		t.Fatalf("replica %s: stats: %v", p.name, err)
	}
	return s
}

// signal sends sig to the replica process.
func (p *replicaProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("replica %s: %v: %v", p.name, sig, err)
	}
}

// kill ends the replica with SIGKILL, as a crash would, and waits until it
// has exited.
func (p *replicaProc) kill(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	p.signal(t, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(exitWithin):
		t.Fatalf("replica %s still running %v after SIGKILL", p.name, exitWithin)
	}
}

// quit asks the replica to exit: it is continued if stopped, killed if the
// test failed, and its stdin is closed. It may be called more than once.
func (p *replicaProc) quit() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot exit
	if p.t.Failed() {
		_ = p.cmd.Process.Kill()
	}
	p.wmu.Lock()
	_ = p.stdin.Close()
	p.wmu.Unlock()
}

// stop ends the replica when the test ends. A replica that was not killed
// must exit cleanly once its stdin ends: no error, no race report.
func (p *replicaProc) stop() {
	t := p.t
	p.quit()
	select {
	case <-p.exited:
	case <-time.After(exitWithin):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("replica %s did not exit within %v of its stdin ending; killed\n%s", p.name, exitWithin, p.output())
		return
	}
	p.mu.Lock()
	killed := p.killed
	p.mu.Unlock()
	switch {
	case killed:
	case p.err != nil && !t.Failed():
		t.Errorf("replica %s: %v\n%s", p.name, p.err, p.output())
	case t.Failed():
		t.Logf("replica %s: %v\n%s", p.name, p.err, p.output())
	}
}

// output is what the replica wrote besides its replies; call it once the
// process has exited.
func (p *replicaProc) output() string {
	select {
	case <-p.exited:
	default:
		return "(still running)"
	}
	var b strings.Builder
	if len(p.noise) > 0 {
		fmt.Fprintf(&b, "stdout:\n%s\n", strings.Join(p.noise, "\n"))
	}
	if p.stderr.Len() > 0 {
		fmt.Fprintf(&b, "stderr:\n%s", p.stderr.String())
	}
	return b.String()
}

// waitLoad waits until the replica announces c's load.
func (c *procCall) waitLoad(t *testing.T) {
	t.Helper()
	select {
	case <-c.loaded:
	case r := <-c.done:
		t.Fatalf("replica %s: request %d ended without a load: %s %s", c.p.name, c.id, r.kind, r.rest)
	case <-time.After(replyWithin):
		t.Fatalf("replica %s: request %d made no load within %v", c.p.name, c.id, replyWithin)
	}
}

// wait returns c's final reply.
func (c *procCall) wait(t *testing.T) reply {
	t.Helper()
	select {
	case r := <-c.done:
		return r
	case <-time.After(replyWithin):
		t.Fatalf("replica %s: no reply to request %d within %v", c.p.name, c.id, replyWithin)
		return reply{}
	}
}

// result returns the value a get's callers were served and how many loads
// it ran; it ends the test if the get failed.
func (c *procCall) result(t *testing.T) (string, int64) {
	t.Helper()
	r := c.wait(t)
	loads, value, _ := strings.Cut(r.rest, " ")
	n, err := strconv.ParseInt(loads, 10, 64)
	if r.kind != "ok" || err != nil {
		t.Fatalf("replica %s: get %d: %s %s", c.p.name, c.id, r.kind, r.rest)
	}
	return value, n
}

// procFleet is replica processes over one redis-server, and the parent's
// own view of that server.
type procFleet struct {
	procs  []*replicaProc
	rdb    *redis.Client
	remote *redisstore.Remote // reads what the replicas stored
	prefix string
	counts string
}

// startFleet starts a redis-server and n replica processes over it, and
// waits until every replica is ready.
func startFleet(t *testing.T, n int, softTTL, leaseTTL time.Duration) *procFleet {
	t.Helper()
	node := redistest.Server(t)
	f := &procFleet{
		rdb:    node.Client(),
		prefix: fmt.Sprintf("proc:%s:", t.Name()),
		counts: fmt.Sprintf("loads:%s", t.Name()),
	}
	var err error
	if f.remote, err = redisstore.New(redisstore.Options{Client: f.rdb, Prefix: f.prefix, Timeout: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.remote.Close() })
	for i := range n {
		f.procs = append(f.procs, startProc(t, replicaConfig{
			Name:     fmt.Sprintf("r%d", i),
			Addr:     node.Addr,
			Prefix:   f.prefix,
			Counts:   f.counts,
			SoftTTL:  softTTL,
			LeaseTTL: leaseTTL,
		}))
	}
	// Replicas exit together: under -race each waits a second at exit.
	t.Cleanup(func() {
		for _, p := range f.procs {
			p.quit()
		}
	})
	for _, p := range f.procs {
		p.waitReady(t)
	}
	return f
}

// loads returns the loads each replica has counted in Redis, in the order
// of f.procs, killed replicas included.
func (f *procFleet) loads(t *testing.T) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := f.rdb.HGetAll(ctx, f.counts).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(f.procs))
	for i, p := range f.procs {
		if s, ok := m[p.name]; ok {
			if out[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// leaseKey returns the Redis key of key's lease, found through the fence
// key that every Acquire leaves beside it (<prefix>{<tag>}:<key>:f and
// …:l, as package redisstore documents).
func (f *procFleet) leaseKey(t *testing.T, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fences, err := f.rdb.Keys(ctx, f.prefix+"{*}:"+key+":f").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(fences) != 1 {
		t.Fatalf("fence keys of %q: %q, want one", key, fences)
	}
	return strings.TrimSuffix(fences[0], ":f") + ":l"
}

// leaseToken returns the token that holds the lease key name, or "" when
// no lease is held.
func (f *procFleet) leaseToken(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tok, err := f.rdb.Get(ctx, name).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// eventually polls cond until it holds, for at most within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, within)
		case <-tick.C:
		}
	}
}

// leaseGone waits until no lease on the Redis key name is held, and
// returns how long that took.
func (f *procFleet) leaseGone(t *testing.T, name string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, within, "lease "+name+" to expire", func() bool { return f.leaseToken(t, name) == "" })
	return time.Since(start)
}

// expired waits until key's value has left Redis (its hard TTL ended), for
// at most within. A replica's local copy carries the expiry its writer
// computed before the write, so it is past it too.
func (f *procFleet) expired(t *testing.T, key string, within time.Duration) {
	t.Helper()
	eventually(t, within, fmt.Sprintf("%q to expire from Redis", key), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		env, err := f.remote.Load(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return env == nil
	})
}

// stored returns the value Redis holds for key, read by a fresh cache that
// must not load.
func (f *procFleet) stored(t *testing.T, key string) string {
	t.Helper()
	v, ok := f.storedIf(t, key)
	if !ok {
		t.Fatalf("reading %q from Redis: no value in Redis", key)
	}
	return v
}

// storedIf is stored, reporting whether Redis holds a value at all.
func (f *procFleet) storedIf(t *testing.T, key string) (string, bool) {
	t.Helper()
	c, err := herd.New(&herd.Options[string]{NoNearCache: true, NoBreaker: true, MaxEntries: 10, SoftTTL: time.Minute, Store: f.remote})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), replyWithin)
	defer cancel()
	defer c.Close(ctx)
	v, err := c.Get(ctx, key, func(context.Context) (string, error) {
		return "", herd.ErrNotFound
	})
	switch {
	case errors.Is(err, herd.ErrNotFound):
		return "", false
	case err != nil:
		t.Fatalf("reading %q from Redis: %v", key, err)
	}
	return v, true
}
