package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// spanHook records the Redis keys of each pipeline a client sends (the
// first key of each command) and their bytes, and fails every command of a
// pipeline that holds a key containing poison, as if that pipeline's
// answer had been lost.
type spanHook struct {
	mu     sync.Mutex
	pipes  [][]string
	bytes  []int
	poison string
}

func (*spanHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*spanHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *spanHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var keys []string
		n := 0
		for _, cmd := range cmds {
			args := cmd.Args()
			for _, a := range args {
				n += len(fmt.Sprint(a))
			}
			switch cmd.Name() {
			case "get":
				keys = append(keys, fmt.Sprint(args[1]))
			case "evalsha":
				keys = append(keys, fmt.Sprint(args[3]))
			}
		}
		if len(keys) == 0 {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		h.pipes = append(h.pipes, keys)
		h.bytes = append(h.bytes, n)
		poison := h.poison
		h.mu.Unlock()
		err := next(ctx, cmds)
		for _, k := range keys {
			if poison != "" && strings.Contains(k, poison) {
				for _, cmd := range cmds {
					cmd.SetErr(errInjected)
				}
				break
			}
		}
		return err
	}
}

// take returns the pipelines recorded since the last take.
func (h *spanHook) take() ([][]string, []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, b := h.pipes, h.bytes
	h.pipes, h.bytes = nil, nil
	return p, b
}

// TestBatchSpans checks that batch calls split their entries into
// pipelines of at most BatchKeys keys and BatchBytes bytes, an entry
// larger than that alone, keep their results in order, and that a
// pipeline that fails fails only its own entries.
func TestBatchSpans(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	c := n.Client()
	h := &spanHook{}
	c.AddHook(h)
	const batchKeys, batchBytes = 10, 8 << 10
	r := newRemote(t, c, Options{BatchKeys: batchKeys, BatchBytes: batchBytes})
	ctx := t.Context()

	keys := make([]string, 35)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	gs := acquireAll(t, r, keys...)
	big := fresh(strings.Repeat("x", 3*batchBytes))
	writes := make([]remote.HeldWrite, len(keys))
	for i, k := range keys {
		env := fresh("v" + k)
		if i == 17 {
			env = big
		}
		writes[i] = remote.HeldWrite{HeldKey: remote.HeldKey{Key: k, Token: gs[k].Token}, Env: env, Fence: gs[k].Fence, TTL: time.Minute}
	}
	h.take()
	for i, o := range r.WriteReleaseMany(ctx, writes) {
		if !o.OK || o.Err != nil {
			t.Errorf("WriteReleaseMany: %q = %+v; want written", keys[i], o)
		}
	}
	pipes, sizes := h.take()
	seen := map[string]bool{} // the first pipeline is sent again after NOSCRIPT
	for j, p := range pipes {
		if len(p) > batchKeys || len(p) > 1 && sizes[j] > batchBytes {
			t.Errorf("WriteReleaseMany pipeline %d: %d keys, %d bytes; want at most %d keys and %d bytes, or one key", j, len(p), sizes[j], batchKeys, batchBytes)
		}
		for _, k := range p {
			if k == r.space.Names("k17").Value && len(p) != 1 {
				t.Errorf("the value longer than BatchBytes shared pipeline %d with %d others", j, len(p)-1)
			}
			seen[k] = true
		}
	}
	if len(seen) != len(keys) || len(pipes) < 5 {
		t.Errorf("WriteReleaseMany sent %d keys in %d pipelines; want %d in at least 5", len(seen), len(pipes), len(keys))
	}

	got := r.LoadMany(ctx, keys)
	for i, l := range got {
		want := fresh("v" + keys[i])
		if i == 17 {
			want = big
		}
		if l.Err != nil || len(l.Value) != len(want) || !bytes.Equal(l.Value[envelope.HeaderSize:], want[envelope.HeaderSize:]) {
			t.Errorf("LoadMany: %q = %d bytes, %v; want its own value", keys[i], len(l.Value), l.Err)
		}
	}
	pipes, _ = h.take()
	for j, p := range pipes {
		if len(p) > batchKeys {
			t.Errorf("LoadMany pipeline %d: %d keys; want at most %d", j, len(p), batchKeys)
		}
	}

	h.mu.Lock()
	h.poison = r.space.Names("k25").Value
	h.mu.Unlock()
	got = r.LoadMany(ctx, keys)
	pipes, _ = h.take()
	failed := map[string]bool{}
	for _, p := range pipes {
		if slices.Contains(p, r.space.Names("k25").Value) {
			for _, k := range p {
				failed[k] = true
			}
		}
	}
	if len(failed) == 0 || len(failed) > batchKeys {
		t.Fatalf("the poisoned pipeline held %d keys; want 1 to %d", len(failed), batchKeys)
	}
	for i, l := range got {
		if fail := failed[r.space.Names(keys[i]).Value]; fail != (l.Err != nil) || !fail && l.Value == nil {
			t.Errorf("LoadMany with one pipeline failing: %q = %d bytes, %v; want an error only for the %d keys of that pipeline", keys[i], len(l.Value), l.Err, len(failed))
		}
	}
}

// TestAddHotSpans checks that AddHot sends its reads in transactions of at
// most BatchKeys keys, and that all of them count.
func TestAddHotSpans(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	c := n.Client()
	r := newRemote(t, c, Options{BatchKeys: 10})
	ctx := t.Context()
	reads := map[string]uint64{}
	for i := range 35 {
		reads[fmt.Sprint("k", i)] = uint64(i + 1)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.AddHot(ctx, reads, 100, time.Minute); err != nil {
		t.Fatalf("AddHot: %v", err)
	}
	stats, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if calls := commandCalls(t, stats); calls["exec"] != 4 || calls["zincrby"] != 35 {
		t.Errorf("AddHot of 35 reads sent %d transactions and %d ZINCRBY; want 4 and 35", calls["exec"], calls["zincrby"])
	}
	hot, err := r.Hot(ctx, 100, time.Minute)
	if err != nil || len(hot) != 35 || hot[0] != "k34" {
		t.Errorf("Hot = %v, %v; want the 35 keys, k34 first", hot, err)
	}
}
