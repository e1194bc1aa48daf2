package redisfleet_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// roundTrips is a go-redis hook that counts what a client sends to Redis:
// each command sent alone and each pipeline is one round trip. The pub/sub
// connection's traffic (SUBSCRIBE and the notices it receives) does not pass
// the hooks; only its handshake does, once, when the Remote subscribes.
type roundTrips struct {
	trips atomic.Int64

	mu     sync.Mutex
	byName map[string]int64 // commands by name, pipelined ones included; guarded by mu

	// done, when not nil, is called after each command sent alone, with
	// how long it took and its error. It is set before the client is used.
	done func(cmd redis.Cmder, took time.Duration, err error)
}

func (h *roundTrips) add(cmds ...redis.Cmder) {
	h.trips.Add(1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.byName == nil {
		h.byName = map[string]int64{}
	}
	for _, cmd := range cmds {
		h.byName[cmd.Name()]++
	}
}

// count returns how many commands named name the client has sent.
func (h *roundTrips) count(name string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byName[name]
}

func (*roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		start := time.Now()
		err := next(ctx, cmd)
		if h.done != nil {
			h.done(cmd, time.Since(start), err)
		}
		return err
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(cmds...)
		return next(ctx, cmds)
	}
}

// commandstats returns how many calls of each command the server has
// served (INFO commandstats), commands run inside scripts included, and
// their total.
func commandstats(t *testing.T, c redis.UniversalClient) (map[string]int64, int64) {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls, total := map[string]int64{}, int64(0)
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		calls[name] = n
		total += n
	}
	return calls, total
}
