package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/notify"
)

// batchEnv is a Redis server or Cluster for the batch tests, with a client
// whose calls are counted per node.
type batchEnv struct {
	// client is the hooked client the Remotes under test use.
	client redis.UniversalClient
	// masters has one plain client per master, for SCRIPT FLUSH and INFO.
	masters []*redis.Client
	calls   *callCounter
}

// singleEnv starts one redis-server.
func singleEnv(t *testing.T) *batchEnv {
	n := redistest.Server(t)
	calls := &callCounter{}
	c := n.Client()
	c.AddHook(calls.hook(n.Addr))
	return &batchEnv{client: c, masters: []*redis.Client{n.Client()}, calls: calls}
}

// clusterEnv starts a Cluster of three masters; its client counts what it
// sends to each node, as the node clients it makes see it.
func clusterEnv(t *testing.T) *batchEnv {
	cl := redistest.Cluster(t)
	calls := &callCounter{}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	c.OnNewNode(func(n *redis.Client) { n.AddHook(calls.hook(n.Options().Addr)) })
	env := &batchEnv{client: c, calls: calls}
	for _, n := range cl.Nodes {
		env.masters = append(env.masters, n.Client())
	}
	return env
}

// remote returns a Remote under prefix, closed when the test ends.
func (env *batchEnv) remote(t *testing.T, prefix string) *Remote {
	t.Helper()
	return newRemote(t, env.client, Options{Prefix: prefix})
}

// flush empties every master's script cache.
func (env *batchEnv) flush(t *testing.T) {
	t.Helper()
	for _, m := range env.masters {
		if err := m.ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
	}
}

// loadScripts loads the batch calls' scripts on every master, as any
// earlier call would have.
func (env *batchEnv) loadScripts(t *testing.T) {
	t.Helper()
	for _, m := range env.masters {
		for _, s := range []*redis.Script{acquireScript, extendScript, batchWriteReleaseScript, batchReleaseScript} {
			if err := s.Load(t.Context(), m).Err(); err != nil {
				t.Fatalf("SCRIPT LOAD: %v", err)
			}
		}
	}
}

// resetStats clears every master's INFO commandstats.
func (env *batchEnv) resetStats(t *testing.T) {
	t.Helper()
	for _, m := range env.masters {
		if err := m.ConfigResetStat(t.Context()).Err(); err != nil {
			t.Fatalf("CONFIG RESETSTAT: %v", err)
		}
	}
}

// commandStats sums the masters' INFO commandstats: calls by command,
// those that scripts make included.
func (env *batchEnv) commandStats(t *testing.T) map[string]int {
	t.Helper()
	sum := make(map[string]int)
	for _, m := range env.masters {
		stats, err := m.Info(t.Context(), "commandstats").Result()
		if err != nil {
			t.Fatalf("INFO commandstats: %v", err)
		}
		for cmd, n := range commandCalls(t, stats) {
			sum[cmd] += n
		}
	}
	return sum
}

// callCounter counts what a client sends, by node address: pipelines, the
// commands in them, and commands sent alone, by name ("script load" for
// SCRIPT LOAD). The pipelines that set up a new connection are not
// counted.
type callCounter struct {
	mu sync.Mutex
	calls
	// noScript, when set, makes every EVALSHA fail with NOSCRIPT once it has
	// run, as a server would that keeps losing its scripts.
	noScript bool
	// failing, when not empty, makes every pipelined command whose first
	// key holds it fail with errInjected once it has run, as if its
	// server's answer had been lost.
	failing string
}

// errInjected is the error of the commands a callCounter fails.
var errInjected = errors.New("injected failure")

// calls is what a callCounter counted.
type calls struct {
	pipelines map[string]int // by node address
	piped     int            // commands in pipelines, every node
	alone     map[string]int // commands sent alone, by name, every node
}

// reset starts counting from zero.
func (c *callCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = calls{}
}

// counted returns what was counted since reset.
func (c *callCounter) counted() calls {
	c.mu.Lock()
	defer c.mu.Unlock()
	return calls{pipelines: clone(c.pipelines), piped: c.piped, alone: clone(c.alone)}
}

func clone(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// setFailing sets failing.
func (c *callCounter) setFailing(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failing = key
}

// setNoScript sets noScript.
func (c *callCounter) setNoScript(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noScript = on
}

// hook returns the hook of one client, talking to addr.
func (c *callCounter) hook(addr string) redis.Hook { return counterHook{c, addr} }

type counterHook struct {
	c    *callCounter
	addr string
}

func (h counterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h counterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if args := cmd.Args(); name == "script" && len(args) > 1 {
			name += " " + strings.ToLower(fmt.Sprint(args[1]))
		}
		h.c.mu.Lock()
		if h.c.alone == nil {
			h.c.alone = make(map[string]int)
		}
		h.c.alone[name]++
		h.c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h counterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if setup(cmds) {
			return next(ctx, cmds)
		}
		h.c.mu.Lock()
		if h.c.pipelines == nil {
			h.c.pipelines = make(map[string]int)
		}
		h.c.pipelines[h.addr]++
		h.c.piped += len(cmds)
		noScript, failing := h.c.noScript, h.c.failing
		h.c.mu.Unlock()
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			args := cmd.Args()
			switch {
			case noScript && cmd.Name() == "evalsha":
				cmd.SetErr(redis.ErrNoScript)
			case failing != "" && cmd.Name() == "evalsha" && len(args) > 3 && strings.Contains(fmt.Sprint(args[3]), failing):
				cmd.SetErr(errInjected)
			}
		}
		return err
	}
}

// setup reports whether cmds only set up a new connection.
func setup(cmds []redis.Cmder) bool {
	for _, cmd := range cmds {
		switch cmd.Name() {
		case "hello", "auth", "select", "readonly", "client":
		default:
			return false
		}
	}
	return true
}

// total returns how many pipelines were sent, to every node.
func (c calls) total() int {
	n := 0
	for _, p := range c.pipelines {
		n += p
	}
	return n
}

// onePerMaster checks that a batch of cmds commands went out as at most one
// pipeline to each master, with no command sent twice.
func (env *batchEnv) onePerMaster(t *testing.T, op string, got calls, cmds int) {
	t.Helper()
	for addr, n := range got.pipelines {
		if n > 1 {
			t.Errorf("%s sent %d pipelines to %s, want one", op, n, addr)
		}
	}
	if n := got.total(); n < 1 || n > len(env.masters) {
		t.Errorf("%s sent %d pipelines, want 1 to %d (one per master)", op, n, len(env.masters))
	}
	if got.piped != cmds {
		t.Errorf("%s pipelined %d commands, want %d", op, got.piped, cmds)
	}
}

// published returns how many notices got published outside pipelines:
// PUBLISH on the channel and SPUBLISH on shard channels.
func (c calls) published() int { return c.alone["publish"] + c.alone["spublish"] }

// channels returns how many channels r announces the notices of keys on:
// one for a batch notice on each (see announce).
func channels(t *testing.T, r *Remote, keys []string) int {
	t.Helper()
	seen := make(map[string]bool)
	for _, k := range keys {
		seen[r.noticeChannel(t.Context(), r.space.Names(k).Value)] = true
	}
	return len(seen)
}

// expectBatchNotices receives the notices of a batch, want, from notices,
// then Sets a marker key on each channel holder announces on and receives
// their notices: each channel's notices must come in order, the batch's
// and then the marker's, and nothing else (once every marker has come,
// the batch announced nothing more on any channel). Over one channel
// that is the order of want; over a Cluster's shard channels, only each
// channel's notices have an order.
func expectBatchNotices(t *testing.T, holder *Remote, notices <-chan notify.Notice, want []notify.Notice) {
	t.Helper()
	ctx := t.Context()
	channel := func(key string) string { return holder.noticeChannel(ctx, holder.space.Names(key).Value) }
	markers := make(map[string]string) // channel → marker key
	for i := 0; i < 64*len(holder.shardChannels)+1; i++ {
		k := fmt.Sprint("marker/", i)
		if ch := channel(k); markers[ch] == "" {
			markers[ch] = k
		}
	}
	var got []notify.Notice
	for range want {
		got = append(got, plain(next(t, notices)))
	}
	for _, k := range markers {
		f, err := holder.Set(ctx, k, fresh("m"), time.Minute)
		if err != nil {
			t.Fatalf("Set(%q): %v", k, err)
		}
		want = append(want, notify.Notice{Key: k, Fence: f})
	}
	for range markers {
		got = append(got, plain(next(t, notices)))
	}
	byChannel := func(ns []notify.Notice) map[string][]notify.Notice {
		m := make(map[string][]notify.Notice)
		for _, n := range ns {
			m[channel(n.Key)] = append(m[channel(n.Key)], n)
		}
		return m
	}
	if diff := cmp.Diff(byChannel(want), byChannel(got)); diff != "" {
		t.Fatalf("notices by channel, the batch's then a marker's (-want +got):\n%s", diff)
	}
}

// batchKeys returns the 100 keys of a batch test: odd bytes, the empty key,
// and enough keys to reach every master of a Cluster.
func batchKeys() []string {
	keys := append([]string{""}, clusterKeys...)
	for i := len(keys); i < 100; i++ {
		keys = append(keys, fmt.Sprint("k/", i))
	}
	return keys
}

// requests returns a LeaseRequest with no after for each key.
func requests(keys []string) []remote.LeaseRequest {
	reqs := make([]remote.LeaseRequest, len(keys))
	for i, k := range keys {
		reqs[i] = remote.LeaseRequest{Key: k}
	}
	return reqs
}

// sameErr reports whether two errors are alike: both nil, or both non-nil
// with the same text.
func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error()
}

// TestBatch runs the batch calls on one server and on a Cluster, each
// against what the single calls give.
func TestBatch(t *testing.T) {
	t.Parallel()
	for _, env := range []struct {
		name  string
		start func(*testing.T) *batchEnv
	}{{"Single", singleEnv}, {"Cluster", clusterEnv}} {
		t.Run(env.name, func(t *testing.T) {
			t.Parallel()
			e := env.start(t)
			// One at a time: they count the calls of one client.
			for _, tc := range []struct {
				name string
				test func(*testing.T, *batchEnv)
			}{
				{"LoadMany", testLoadMany},
				{"AcquireMany", testAcquireMany},
				{"ExtendMany", testExtendMany},
				{"WriteReleaseMany", testWriteReleaseMany},
				{"PartialFailure", testWriteReleasePartialFailure},
				{"Refused", testBatchRefused},
				{"ScriptFlush", testBatchScriptFlush},
				{"NoScriptBounded", testNoScriptBounded},
				{"MalformedNotice", testMalformedBatchNotice},
			} {
				t.Run(tc.name, func(t *testing.T) {
					e.loadScripts(t)
					tc.test(t, e)
				})
			}
		})
	}
}

// testLoadMany checks that LoadMany gives, for each key, what Load gives:
// nothing, an envelope, bytes that are not one, or the error of a key of
// another type, in one pipeline per master.
func testLoadMany(t *testing.T, env *batchEnv) {
	r := env.remote(t, "load:")
	ctx := t.Context()
	keys := batchKeys()
	for i, k := range keys {
		n := r.space.Names(k)
		var err error
		switch i % 4 {
		case 1:
			_, err = r.Set(ctx, k, fresh(k), time.Minute)
		case 2:
			err = env.client.Set(ctx, n.Value, "not an envelope: "+k, time.Minute).Err()
		case 3:
			err = env.client.HSet(ctx, n.Value, "f", "v").Err()
		}
		if err != nil {
			t.Fatalf("setting up %q: %v", k, err)
		}
	}

	env.calls.reset()
	got := r.LoadMany(ctx, keys)
	env.onePerMaster(t, "LoadMany", env.calls.counted(), len(keys))
	if len(got) != len(keys) {
		t.Fatalf("LoadMany of %d keys gave %d entries", len(keys), len(got))
	}
	for i, k := range keys {
		want, err := r.Load(ctx, k)
		if !bytes.Equal(got[i].Value, want) || (got[i].Value == nil) != (want == nil) || !sameErr(got[i].Err, err) {
			t.Errorf("LoadMany[%d] (%q) = %q, %v; Load gives %q, %v", i, k, got[i].Value, got[i].Err, want, err)
		}
		if i%4 == 3 && !errors.Is(got[i].Err, remote.ErrRejected) {
			t.Errorf("LoadMany[%d] of a hash: %v, want an error wrapping remote.ErrRejected", i, got[i].Err)
		}
	}
}

// testAcquireMany checks that AcquireMany answers each key as Acquire
// answers a twin key in the same state, returns the stored value that was
// not fresh as Stale, takes each lease under its own token and fence, and
// fails a key whose fence is corrupt alone.
func testAcquireMany(t *testing.T, env *batchEnv) {
	r := env.remote(t, "acquire:")
	twin := env.remote(t, "acquire-twin:")
	ctx := t.Context()
	keys := append(batchKeys(), "badfence")
	stale := envelope.Append(nil, &envelope.Envelope{
		Soft:  time.Now().Add(-time.Minute).UnixMilli(),
		Hard:  time.Now().Add(time.Hour).UnixMilli(),
		Value: []byte("stale"),
	})
	reqs := requests(keys)
	setup := func(r *Remote, i int, k string) {
		t.Helper()
		n := r.space.Names(k)
		var err error
		switch {
		case k == "badfence":
			err = env.client.Set(ctx, n.Fence, "not a fence", time.Minute).Err()
		case i%6 == 1, i%6 == 5: // fresh; 5 asks for a value fresher than it
			_, err = r.Set(ctx, k, fresh(k), time.Minute)
			if i%6 == 5 {
				reqs[i].After = time.Now().Add(2 * time.Hour)
			}
		case i%6 == 2, i%6 == 3: // stale; 3 under another holder's lease
			_, err = r.Set(ctx, k, stale, time.Minute)
			if err == nil && i%6 == 3 {
				err = env.client.Set(ctx, n.Lease, "another holder", time.Minute).Err()
			}
		case i%6 == 4:
			err = env.client.Set(ctx, n.Value, "not an envelope", time.Minute).Err()
		}
		if err != nil {
			t.Fatalf("setting up %q: %v", k, err)
		}
	}
	stored := make([][]byte, len(keys))
	for i, k := range keys {
		setup(r, i, k)
		setup(twin, i, k)
		stored[i], _ = r.Load(ctx, k)
	}

	env.calls.reset()
	got := r.AcquireMany(ctx, reqs, time.Minute)
	env.onePerMaster(t, "AcquireMany", env.calls.counted(), len(keys))
	if len(got) != len(keys) {
		t.Fatalf("AcquireMany of %d keys gave %d entries", len(keys), len(got))
	}
	kind := func(g remote.Grant) string {
		switch {
		case g.Value != nil:
			return "value"
		case g.Token != "":
			return "lease"
		case g.HeldFor > 0:
			return "held"
		}
		return "nothing"
	}
	tokens := make(map[string]bool)
	for i, k := range keys {
		a := got[i]
		want, err := twin.Acquire(ctx, k, time.Minute, reqs[i].After)
		if (a.Err == nil) != (err == nil) || errors.Is(a.Err, remote.ErrRejected) != errors.Is(err, remote.ErrRejected) {
			t.Errorf("AcquireMany[%d] (%q) error %v; Acquire's %v", i, k, a.Err, err)
			continue
		}
		if a.Err != nil {
			if k != "badfence" {
				t.Errorf("AcquireMany[%d] (%q): %v", i, k, a.Err)
			}
			continue
		}
		if kind(a.Grant) != kind(want) {
			t.Errorf("AcquireMany[%d] (%q) = %+v, a %s; Acquire gives %+v, a %s", i, k, a.Grant, kind(a.Grant), want, kind(want))
			continue
		}
		var wantStale []byte
		switch kind(a.Grant) {
		case "value":
			if !bytes.Equal(a.Value, stored[i]) {
				t.Errorf("AcquireMany[%d] (%q) gave value %q, stored %q", i, k, a.Value, stored[i])
			}
		case "lease":
			n := r.space.Names(k)
			if tok, err := env.client.Get(ctx, n.Lease).Result(); tok != a.Token || err != nil {
				t.Errorf("AcquireMany[%d] (%q): lease key holds %q, %v; want the token %q", i, k, tok, err, a.Token)
			}
			if f, err := env.client.Get(ctx, n.Fence).Uint64(); f != a.Fence || err != nil {
				t.Errorf("AcquireMany[%d] (%q): fence key holds %d, %v; want the fence %d", i, k, f, err, a.Fence)
			}
			if tokens[a.Token] {
				t.Errorf("AcquireMany[%d] (%q): token %q given twice", i, k, a.Token)
			}
			tokens[a.Token] = true
			wantStale = stored[i]
		case "held":
			if a.HeldFor > time.Minute {
				t.Errorf("AcquireMany[%d] (%q): held for %v, longer than the lease", i, k, a.HeldFor)
			}
			wantStale = stored[i]
		}
		if !bytes.Equal(a.Stale, wantStale) || (a.Stale == nil) != (wantStale == nil) {
			t.Errorf("AcquireMany[%d] (%q), a %s: Stale %q, want %q", i, k, kind(a.Grant), a.Stale, wantStale)
		}
	}
	if got := got[len(keys)-1].Err; !errors.Is(got, remote.ErrRejected) {
		t.Errorf("AcquireMany over a corrupt fence: %v, want an error wrapping remote.ErrRejected", got)
	}
	for _, want := range []int{0, 2, 3, 4, 5} { // every state but 1, the fresh value, gives a lease or a holder
		if g := got[want]; g.Value != nil || (want == 3) != (g.HeldFor > 0) || (g.Stale == nil) != (want == 0) {
			t.Errorf("AcquireMany[%d] = %+v: not what the state set up gives", want, g)
		}
	}
}

// testExtendMany checks that ExtendMany extends exactly the leases whose
// tokens still hold them, as Extend does, in one pipeline per master with
// no command for an empty token.
func testExtendMany(t *testing.T, env *batchEnv) {
	r := env.remote(t, "extend:")
	ctx := t.Context()
	keys := batchKeys()
	acq := r.AcquireMany(ctx, requests(keys), time.Minute)
	leases := make([]remote.HeldKey, 0, len(keys)+1)
	sent := 0
	for i, k := range keys {
		if acq[i].Err != nil || acq[i].Token == "" {
			t.Fatalf("AcquireMany[%d] (%q) = %+v, want a lease", i, k, acq[i])
		}
		token := acq[i].Token
		switch i % 4 {
		case 2:
			token = "not the token"
		case 3:
			token = ""
		}
		if token != "" {
			sent++
		}
		leases = append(leases, remote.HeldKey{Key: k, Token: token})
	}
	leases = append(leases, remote.HeldKey{Key: "no lease", Token: "some token"})
	sent++

	env.calls.reset()
	got := r.ExtendMany(ctx, leases, time.Hour)
	env.onePerMaster(t, "ExtendMany", env.calls.counted(), sent)
	if len(got) != len(leases) {
		t.Fatalf("ExtendMany of %d leases gave %d entries", len(leases), len(got))
	}
	for i, l := range leases {
		want := i < len(keys) && i%4 < 2
		if got[i].OK != want || got[i].Err != nil {
			t.Errorf("ExtendMany[%d] (%q, %q) = %+v, want OK %v", i, l.Key, l.Token, got[i], want)
		}
		if ok, err := r.Extend(ctx, l.Key, l.Token, time.Hour); ok != got[i].OK || err != nil {
			t.Errorf("ExtendMany[%d] (%q) = %+v; Extend gives %v, %v", i, l.Key, got[i], ok, err)
		}
		left, err := env.client.PTTL(ctx, r.space.Names(l.Key).Lease).Result()
		if err != nil {
			t.Fatalf("PTTL: %v", err)
		}
		if extended := left > time.Minute; i < len(keys) && extended != want {
			t.Errorf("ExtendMany[%d] (%q): lease expires in %v; extended %v, want %v", i, l.Key, left, extended, want)
		}
	}
}

// testWriteReleaseMany checks that WriteReleaseMany writes under current
// fences and refuses stale ones per key, releases the leases its tokens
// hold, as WriteRelease and Release do for twin keys, in one pipeline per
// master and one PUBLISH; that the PUBLISH wakes a Wait-er of each key on
// another Remote and gives its subscriber one Notice per key written; and
// that it wakes its own Wait-ers.
func testWriteReleaseMany(t *testing.T, env *batchEnv) {
	const prefix = "writerelease:"
	holder := env.remote(t, prefix)
	other := env.remote(t, prefix)
	twin := env.remote(t, "writerelease-twin:")
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	keys := batchKeys()
	acq := holder.AcquireMany(ctx, requests(keys), time.Minute)
	twinAcq := twin.AcquireMany(ctx, requests(keys), time.Minute)

	// Per key i: 0 writes and releases; 1 is refused, its fence stale, and
	// releases; 2 releases only; 3 writes, its token stale, and leaves the
	// lease. Two more are refused before any call.
	writes := make([]remote.HeldWrite, 0, len(keys)+2)
	twinWrites := make([]remote.HeldWrite, 0, len(keys)+2)
	for i, k := range keys {
		if acq[i].Token == "" || twinAcq[i].Token == "" {
			t.Fatalf("AcquireMany[%d] (%q) = %+v, %+v; want leases", i, k, acq[i], twinAcq[i])
		}
		for _, w := range []struct {
			to *[]remote.HeldWrite
			a  remote.Acquired
		}{{&writes, acq[i]}, {&twinWrites, twinAcq[i]}} {
			hw := remote.HeldWrite{HeldKey: remote.HeldKey{Key: k, Token: w.a.Token}, Env: fresh(fmt.Sprint("v", i)), Fence: w.a.Fence, TTL: time.Minute}
			switch i % 4 {
			case 1:
				hw.Fence--
			case 2:
				hw.Env = nil
			case 3:
				hw.Token = "not the token"
			}
			*w.to = append(*w.to, hw)
		}
	}
	rejected := []remote.HeldWrite{
		{HeldKey: remote.HeldKey{Key: keys[0], Token: acq[0].Token}, Env: []byte("not an envelope"), Fence: acq[0].Fence, TTL: time.Minute},
		{HeldKey: remote.HeldKey{Key: keys[0], Token: acq[0].Token}, Env: fresh("v"), Fence: acq[0].Fence},
	}
	writes = append(writes, rejected...)
	twinWrites = append(twinWrites, rejected...)

	// Wait-ers: on the other Remote, of a key of each kind and of a key the
	// batch leaves alone; on the holder, of one key.
	registered := make(chan string, 8)
	other.onWait = func(k string) { registered <- k }
	holder.onWait = other.onWait
	notices := subscribe(t, other)
	waits := make(map[string]chan error)
	wait := func(r *Remote, k string) {
		ch := make(chan error, 1)
		waits[fmt.Sprintf("%p %q", r, k)] = ch
		go func() { ch <- r.Wait(ctx, k) }()
		<-registered
	}
	for i := range 4 {
		wait(other, keys[i])
	}
	wait(other, "alone")
	wait(holder, keys[1])

	env.resetStats(t)
	env.calls.reset()
	got := holder.WriteReleaseMany(ctx, writes)
	counted := env.calls.counted()
	stats := env.commandStats(t)
	env.onePerMaster(t, "WriteReleaseMany", counted, len(keys))
	if want := channels(t, holder, keys); counted.published() != want || stats["publish"]+stats["spublish"] != want {
		t.Errorf("WriteReleaseMany published %d times (%d by INFO commandstats, scripts included), want %d: once on each channel",
			counted.published(), stats["publish"]+stats["spublish"], want)
	}
	if len(got) != len(writes) {
		t.Fatalf("WriteReleaseMany of %d writes gave %d entries", len(writes), len(got))
	}
	var written []notify.Notice
	for i, w := range writes {
		tw := twinWrites[i]
		var want remote.Outcome
		if tw.Env == nil {
			want.Err = twin.Release(ctx, tw.Key, tw.Token)
		} else {
			want.OK, want.Err = twin.WriteRelease(ctx, tw.Key, tw.Env, tw.Fence, tw.TTL, tw.Token)
		}
		if got[i].OK != want.OK || (got[i].Err == nil) != (want.Err == nil) || errors.Is(got[i].Err, remote.ErrRejected) != errors.Is(want.Err, remote.ErrRejected) {
			t.Errorf("WriteReleaseMany[%d] (%q) = %+v; the single calls give %+v", i, w.Key, got[i], want)
		}
		if i >= len(keys) {
			if !errors.Is(got[i].Err, remote.ErrRejected) {
				t.Errorf("WriteReleaseMany[%d] = %+v, want an error wrapping remote.ErrRejected", i, got[i])
			}
			continue
		}
		if wantOK := i%4 == 0 || i%4 == 3; got[i].OK != wantOK || got[i].Err != nil {
			t.Errorf("WriteReleaseMany[%d] (%q) = %+v, want OK %v", i, w.Key, got[i], wantOK)
		}
		n := holder.space.Names(w.Key)
		if held, err := env.client.Exists(ctx, n.Lease).Result(); err != nil || (held == 1) != (i%4 == 3) {
			t.Errorf("WriteReleaseMany[%d] (%q): lease held %v, %v; want %v", i, w.Key, held == 1, err, i%4 == 3)
		}
		b, err := holder.Load(ctx, w.Key)
		if err != nil {
			t.Fatalf("Load(%q): %v", w.Key, err)
		}
		if !got[i].OK {
			if b != nil {
				t.Errorf("WriteReleaseMany[%d] (%q) refused, yet the key holds %q", i, w.Key, b)
			}
			continue
		}
		e, err := envelope.Decode(b)
		if err != nil || string(e.Value) != fmt.Sprint("v", i) || e.Fence != w.Fence {
			t.Errorf("WriteReleaseMany[%d] (%q) wrote %+v, %v; want v%d under fence %d", i, w.Key, e, err, i, w.Fence)
		}
		written = append(written, notify.Notice{Key: w.Key, Fence: w.Fence})
	}

	for name, ch := range waits {
		if strings.HasSuffix(name, `"alone"`) {
			continue
		}
		if err := <-ch; err != nil {
			t.Errorf("Wait %s: %v", name, err)
		}
	}
	// Once the markers' notices are delivered, the batch gave no other
	// notice and woke no other key.
	expectBatchNotices(t, holder, notices, written)
	if !waiting(other, "alone") {
		t.Error("a Wait of a key outside the batch was woken")
	}
}

// testWriteReleasePartialFailure checks that when some of
// WriteReleaseMany's runs fail, they fail alone: the one PUBLISH announces
// the others' changes and completions, and none of the failed ones'.
func testWriteReleasePartialFailure(t *testing.T, env *batchEnv) {
	const prefix = "partial:"
	holder := env.remote(t, prefix)
	other := env.remote(t, prefix)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprint("ok/", i), fmt.Sprint("lost/", i))
	}
	acq := holder.AcquireMany(ctx, requests(keys), time.Minute)
	writes := make([]remote.HeldWrite, len(keys))
	for i, a := range acq {
		if a.Token == "" {
			t.Fatalf("AcquireMany[%d] = %+v, want a lease", i, a)
		}
		writes[i] = remote.HeldWrite{HeldKey: remote.HeldKey{Key: keys[i], Token: a.Token}, Env: fresh("v"), Fence: a.Fence, TTL: time.Minute}
		if i%4 >= 2 {
			writes[i].Env = nil // release only
		}
	}
	registered := make(chan struct{}, 2)
	other.onWait = func(string) { registered <- struct{}{} }
	notices := subscribe(t, other)
	waitOK, waitLost := make(chan error, 1), make(chan error, 1)
	go func() { waitOK <- other.Wait(ctx, "ok/1") }()
	<-registered
	go func() { waitLost <- other.Wait(ctx, "lost/1") }()
	<-registered

	env.calls.setFailing(":lost/")
	env.calls.reset()
	got := holder.WriteReleaseMany(ctx, writes)
	env.calls.setFailing("")
	var ok []string
	for _, k := range keys {
		if strings.HasPrefix(k, "ok/") {
			ok = append(ok, k)
		}
	}
	if n, want := env.calls.counted().published(), channels(t, holder, ok); n != want {
		t.Errorf("WriteReleaseMany published %d times, want %d: once on each channel", n, want)
	}
	var want []notify.Notice
	for i, o := range got {
		lost := i%2 == 1
		switch {
		case lost && (!errors.Is(o.Err, errInjected) || errors.Is(o.Err, remote.ErrRejected) || o.OK):
			t.Errorf("WriteReleaseMany[%d] (%q) = %+v, want the injected error", i, keys[i], o)
		case !lost && (o.Err != nil || o.OK != (writes[i].Env != nil)):
			t.Errorf("WriteReleaseMany[%d] (%q) = %+v, want OK %v", i, keys[i], o, writes[i].Env != nil)
		case !lost && o.OK:
			want = append(want, notify.Notice{Key: keys[i], Fence: writes[i].Fence})
		}
	}
	if err := <-waitOK; err != nil {
		t.Errorf("Wait of a key whose run answered: %v", err)
	}
	expectBatchNotices(t, holder, notices, want)
	if !waiting(other, "lost/1") {
		t.Error("the completion of a key whose run failed was announced")
	}
}

// testBatchRefused checks the calls that make no round trip: empty
// batches, a ttl that is not positive, and a closed Remote.
func testBatchRefused(t *testing.T, env *batchEnv) {
	r := env.remote(t, "refused:")
	ctx := t.Context()
	env.calls.reset()
	if got := r.LoadMany(ctx, nil); len(got) != 0 {
		t.Errorf("LoadMany(nil) = %v", got)
	}
	if got := r.AcquireMany(ctx, nil, time.Minute); len(got) != 0 {
		t.Errorf("AcquireMany(nil) = %v", got)
	}
	if got := r.ExtendMany(ctx, nil, time.Minute); len(got) != 0 {
		t.Errorf("ExtendMany(nil) = %v", got)
	}
	if got := r.WriteReleaseMany(ctx, nil); len(got) != 0 {
		t.Errorf("WriteReleaseMany(nil) = %v", got)
	}
	keys := []string{"a", "b", "c"}
	for i, a := range r.AcquireMany(ctx, requests(keys), 0) {
		if !errors.Is(a.Err, remote.ErrRejected) {
			t.Errorf("AcquireMany[%d] with ttl 0 = %+v, want an error wrapping remote.ErrRejected", i, a)
		}
	}
	for i, o := range r.ExtendMany(ctx, []remote.HeldKey{{Key: "a", Token: "t"}}, -time.Second) {
		if !errors.Is(o.Err, remote.ErrRejected) {
			t.Errorf("ExtendMany[%d] with ttl -1s = %+v, want an error wrapping remote.ErrRejected", i, o)
		}
	}
	if got := env.calls.counted(); got.total() != 0 || got.alone["publish"] != 0 {
		t.Errorf("refused batches sent %d pipelines and %d PUBLISH, want none", got.total(), got.alone["publish"])
	}

	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed := func(op string, i int, err error) {
		t.Helper()
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s[%d] after Close: %v, want ErrClosed", op, i, err)
		}
	}
	for i, l := range r.LoadMany(ctx, keys) {
		closed("LoadMany", i, l.Err)
	}
	for i, a := range r.AcquireMany(ctx, requests(keys), time.Minute) {
		closed("AcquireMany", i, a.Err)
	}
	for i, o := range r.ExtendMany(ctx, []remote.HeldKey{{Key: "a", Token: "t"}}, time.Minute) {
		closed("ExtendMany", i, o.Err)
	}
	for i, o := range r.WriteReleaseMany(ctx, []remote.HeldWrite{{HeldKey: remote.HeldKey{Key: "a", Token: "t"}},
		{HeldKey: remote.HeldKey{Key: "b", Token: "t"}, Env: fresh("v"), Fence: 1, TTL: time.Minute}}) {
		closed("WriteReleaseMany", i, o.Err)
	}
}

// testBatchScriptFlush checks that every batch call still succeeds after
// SCRIPT FLUSH on every master: the runs that got NOSCRIPT are sent once
// more after the script is loaded, at most one SCRIPT LOAD per script and
// master and one more pipeline per master.
func testBatchScriptFlush(t *testing.T, env *batchEnv) {
	r := env.remote(t, "flush:")
	ctx := t.Context()
	keys := batchKeys()
	bounded := func(op string, scripts int) {
		t.Helper()
		got := env.calls.counted()
		loads := got.alone["script load"]
		if loads < 1 || loads > scripts*len(env.masters) {
			t.Errorf("%s after SCRIPT FLUSH loaded scripts %d times, want 1 to %d", op, loads, scripts*len(env.masters))
		}
		if n := got.total(); n > 2*len(env.masters) {
			t.Errorf("%s after SCRIPT FLUSH sent %d pipelines, want at most %d", op, n, 2*len(env.masters))
		}
		if got.piped > 2*len(keys) {
			t.Errorf("%s after SCRIPT FLUSH pipelined %d commands, want at most %d", op, got.piped, 2*len(keys))
		}
	}

	env.flush(t)
	env.calls.reset()
	acq := r.AcquireMany(ctx, requests(keys), time.Minute)
	bounded("AcquireMany", 1)
	leases := make([]remote.HeldKey, len(keys))
	writes := make([]remote.HeldWrite, len(keys))
	for i, a := range acq {
		if a.Err != nil || a.Token == "" {
			t.Fatalf("AcquireMany[%d] after SCRIPT FLUSH = %+v, want a lease", i, a)
		}
		leases[i] = remote.HeldKey{Key: keys[i], Token: a.Token}
		writes[i] = remote.HeldWrite{HeldKey: leases[i], Fence: a.Fence, TTL: time.Minute}
		if i%2 == 0 {
			writes[i].Env = fresh("v")
		}
	}

	// The script is loaded now: the next batch is one pipeline per master.
	again := make([]string, len(keys))
	for i, k := range keys {
		again[i] = k + "/again"
	}
	env.calls.reset()
	for i, a := range r.AcquireMany(ctx, requests(again), time.Minute) {
		if a.Err != nil || a.Token == "" {
			t.Fatalf("AcquireMany[%d] after the script was loaded again = %+v, want a lease", i, a)
		}
	}
	got := env.calls.counted()
	env.onePerMaster(t, "AcquireMany after the script was loaded again", got, len(keys))
	if n := got.alone["script load"]; n != 0 {
		t.Errorf("AcquireMany after the script was loaded again loaded it %d times", n)
	}

	env.flush(t)
	env.calls.reset()
	for i, o := range r.ExtendMany(ctx, leases, time.Hour) {
		if !o.OK || o.Err != nil {
			t.Fatalf("ExtendMany[%d] after SCRIPT FLUSH = %+v, want OK", i, o)
		}
	}
	bounded("ExtendMany", 1)

	env.flush(t)
	env.calls.reset()
	for i, o := range r.WriteReleaseMany(ctx, writes) {
		if o.OK != (i%2 == 0) || o.Err != nil {
			t.Fatalf("WriteReleaseMany[%d] after SCRIPT FLUSH = %+v, want OK %v", i, o, i%2 == 0)
		}
	}
	bounded("WriteReleaseMany", 2)
	if n, want := env.calls.counted().published(), channels(t, r, keys); n != want {
		t.Errorf("WriteReleaseMany after SCRIPT FLUSH published %d times, want %d: once on each channel", n, want)
	}

}

// testNoScriptBounded checks that a server that keeps answering NOSCRIPT
// costs one retry, not a loop: each run fails with NOSCRIPT after two
// pipelines per master.
func testNoScriptBounded(t *testing.T, env *batchEnv) {
	r := env.remote(t, "noscript:")
	ctx := t.Context()
	keys := batchKeys()
	env.calls.setNoScript(true)
	env.calls.reset()
	got := r.AcquireMany(ctx, requests(keys), time.Minute)
	env.calls.setNoScript(false)
	counted := env.calls.counted()
	for i, a := range got {
		if !redis.HasErrorPrefix(a.Err, "NOSCRIPT") || !strings.HasPrefix(a.Err.Error(), "redisstore: acquire ") {
			t.Errorf("AcquireMany[%d] when every EVALSHA answers NOSCRIPT = %+v, want a redisstore error wrapping NOSCRIPT", i, a)
		}
	}
	if n := counted.total(); n > 2*len(env.masters) {
		t.Errorf("AcquireMany sent %d pipelines, want at most %d", n, 2*len(env.masters))
	}
	if counted.piped != 2*len(keys) {
		t.Errorf("AcquireMany pipelined %d commands, want each of %d runs twice", counted.piped, len(keys))
	}
	if n := counted.alone["script load"]; n < 1 || n > len(env.masters) {
		t.Errorf("AcquireMany loaded the script %d times, want 1 to %d", n, len(env.masters))
	}
}

// testMalformedBatchNotice publishes batch notices by hand: malformed ones
// are ignored whole, the next valid one is delivered, and the echo of this
// Remote's own batch wakes none of its Wait-ers but still tells its
// subscribers.
func testMalformedBatchNotice(t *testing.T, env *batchEnv) {
	r := env.remote(t, "malformed:")
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	registered := make(chan struct{}, 1)
	r.onWait = func(string) { registered <- struct{}{} }
	notices := subscribe(t, r)
	waited := make(chan error, 1)
	go func() { waited <- r.Wait(ctx, "k") }()
	<-registered
	publish := func(p string) {
		t.Helper()
		if err := env.client.Publish(ctx, r.channel, p).Err(); err != nil {
			t.Fatalf("PUBLISH: %v", err)
		}
	}

	origin := strings.Repeat("0", originLen)
	if origin == r.id {
		origin = strings.Repeat("1", originLen)
	}
	for _, records := range malformedRecords {
		publish("b" + origin + records)
	}
	publish("b")
	publish("b" + origin[1:])
	publish(formatBatchNotice(origin, []batchEnd{{key: "good", fence: 7}, {key: "done"}}))
	if n := next(t, notices); n != (notify.Notice{Key: "good", Fence: 7}) {
		t.Fatalf("first notice after malformed ones = %+v, want {good 7}", n)
	}
	if !waiting(r, "k") {
		t.Fatal("a malformed batch notice woke a Wait")
	}

	publish(formatBatchNotice(r.id, []batchEnd{{key: "k"}, {key: "mine", fence: 8}}))
	if n := next(t, notices); n != (notify.Notice{Key: "mine", Fence: 8}) {
		t.Fatalf("notice of this Remote's own batch = %+v, want {mine 8}", n)
	}
	if !waiting(r, "k") {
		t.Fatal("the echo of this Remote's own batch woke a Wait")
	}
	publish(formatBatchNotice(origin, []batchEnd{{key: "k"}}))
	if err := <-waited; err != nil {
		t.Fatalf("Wait after another Remote's batch: %v", err)
	}
}

// malformedRecords are records after a batch notice's origin that make the
// notice malformed; each mentions key k, to be seen if it got through.
var malformedRecords = []string{
	"",                          // no record
	"w0:1:k",                    // fence 0
	"w01:1:k",                   // leading zero
	"w9007199254740992:1:k",     // fence 2^53
	"w18446744073709551616:1:k", // above 2^64
	"w+7:1:k", "w-7:1:k", "w 7:1:k", "w7:01:k", "w7:1k", "w7::k", "w:1:k", "w7",
	"w7:1:kd9:x", // the second record runs past the end
	"w7:1:kz",    // an unknown record kind
	"w7:1:kd1:",  // the second key is missing
	"d01:k", "d:k", "d-1:k", "d+1:k", "d1k", "d2:k", "d1:k:", "q1:k", "D1:k",
	"d18446744073709551616:k",
}

// batchNoticeSeeds seed the fuzzers of notices with batch notices.
func batchNoticeSeeds() []string {
	const origin = "0123456789abcdef"
	seeds := []string{"b", "b" + origin, formatBatchNotice(origin, []batchEnd{{key: "k", fence: 1}}),
		formatBatchNotice(origin, []batchEnd{{key: ""}, {key: "w1:1:k", fence: envelope.MaxFence}, {key: "\x00{}"}})}
	for _, r := range malformedRecords {
		seeds = append(seeds, "b"+origin+r)
	}
	return seeds
}

// checkBatchNotice checks what parseBatchNotice makes of p: a notice it
// accepts has an origin, records under fences below 2^53, and formats back
// as p; dispatch does not panic on it either way.
func checkBatchNotice(t *testing.T, p string) {
	new(Remote).dispatch(p)
	origin, ends, ok := parseBatchNotice(p)
	if !ok {
		return
	}
	if len(origin) != originLen || len(ends) == 0 {
		t.Fatalf("parseBatchNotice(%q) gave origin %q and %d records", p, origin, len(ends))
	}
	for _, e := range ends {
		if e.fence > envelope.MaxFence {
			t.Fatalf("parseBatchNotice(%q) gave fence %d above 2^53", p, e.fence)
		}
	}
	if back := formatBatchNotice(origin, ends); back != p {
		t.Fatalf("parseBatchNotice(%q) = %q, %+v, which formats back as %q", p, origin, ends, back)
	}
}

// checkBatchRoundTrip checks that a batch notice of key, written under
// fence and then done alone, parses back as it was formatted.
func checkBatchRoundTrip(t *testing.T, key string, fence uint64) {
	const origin = "0123456789abcdef"
	want := []batchEnd{{key: key, fence: fence}, {key: key}, {key: key + key, fence: fence}}
	p := formatBatchNotice(origin, want)
	o, ends, ok := parseBatchNotice(p)
	if !ok || o != origin || len(ends) != len(want) {
		t.Fatalf("batch notice %q parsed as %q, %+v, %v", p, o, ends, ok)
	}
	for i := range want {
		if ends[i] != want[i] {
			t.Fatalf("batch notice %q: record %d parsed as %+v, want %+v", p, i, ends[i], want[i])
		}
	}
}

func TestBatchNoticeSeeds(t *testing.T) {
	for _, p := range batchNoticeSeeds() {
		checkBatchNotice(t, p)
	}
	for _, r := range malformedRecords {
		if _, _, ok := parseBatchNotice("b0123456789abcdef" + r); ok {
			t.Errorf("parseBatchNotice accepts records %q", r)
		}
	}
	checkBatchRoundTrip(t, "", 1)
	checkBatchRoundTrip(t, "w1:1:kd0:", envelope.MaxFence)
}

// BenchmarkLoadMany100 compares LoadMany of 100 keys with 100 Load calls,
// on a redis-server the benchmark starts; every key holds a 1 KiB value.
func BenchmarkLoadMany100(b *testing.B) {
	r := newRemote(b, redistest.Server(b).Client(), Options{})
	ctx := context.Background()
	keys := make([]string, 100)
	value := strings.Repeat("v", 1024)
	for i := range keys {
		keys[i] = "bench/load/" + strconv.Itoa(i)
		if _, err := r.Set(ctx, keys[i], fresh(value), time.Hour); err != nil {
			b.Fatalf("Set: %v", err)
		}
	}
	b.Run("impl=batch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i, l := range r.LoadMany(ctx, keys) {
				if l.Err != nil || len(l.Value) < len(value) {
					b.Fatalf("LoadMany[%d] = %d bytes, %v", i, len(l.Value), l.Err)
				}
			}
		}
	})
	b.Run("impl=single", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, k := range keys {
				if v, err := r.Load(ctx, k); err != nil || len(v) < len(value) {
					b.Fatalf("Load(%q) = %d bytes, %v", k, len(v), err)
				}
			}
		}
	})
}

// BenchmarkAcquireMany100 compares AcquireMany of 100 keys with 100
// Acquire calls, on a redis-server the benchmark starts. Every key's lease
// is held (the first call takes it), so each call runs the script to its
// held answer.
func BenchmarkAcquireMany100(b *testing.B) {
	r := newRemote(b, redistest.Server(b).Client(), Options{})
	ctx := context.Background()
	reqs := make([]remote.LeaseRequest, 100)
	for i := range reqs {
		reqs[i].Key = "bench/acquire/" + strconv.Itoa(i)
	}
	b.Run("impl=batch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i, a := range r.AcquireMany(ctx, reqs, time.Hour) {
				if a.Err != nil || a.Value != nil {
					b.Fatalf("AcquireMany[%d] = %+v", i, a)
				}
			}
		}
	})
	b.Run("impl=single", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, q := range reqs {
				if g, err := r.Acquire(ctx, q.Key, time.Hour, q.After); err != nil || g.Value != nil {
					b.Fatalf("Acquire(%q) = %+v, %v", q.Key, g, err)
				}
			}
		}
	})
}
