package redistest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/redisproc"
)

// MasterName is the name under which a SentinelGroup's Sentinels monitor
// its master.
const MasterName = "herd"

// sentinelTimeout bounds each wait of a replica or a Sentinel group for a
// state Redis reaches by itself (a sync, a discovery, a failover).
const sentinelTimeout = 60 * time.Second

// pollTimeout bounds each poll of a Sentinel group.
const pollTimeout = 2 * time.Second

// replicaArgs let a full sync start at once (Redis 7 waits 5 s for more
// replicas by default), on every node, since a replica may be promoted.
var replicaArgs = []string{"--repl-diskless-sync-delay", "0"}

// SentinelGroup is one master, one replica and three Sentinels, each a
// redis-server process on a loopback port; the Sentinels monitor the
// master as MasterName with a quorum of 2 and judge it down after
// DownAfter without an answer.
type SentinelGroup struct {
	// Nodes are the data nodes: Nodes[0] started as the master, Nodes[1]
	// as its replica. A failover swaps their roles; Master finds out.
	Nodes []*Node
	// Sentinels are the three Sentinels.
	Sentinels []*Node

	t testing.TB
	// clients holds one client of each node and Sentinel, by address, for
	// the group's own polling.
	clients map[string]*redis.Client
}

// DownAfter is how long a SentinelGroup's master goes unanswered before a
// Sentinel judges it down.
const DownAfter = time.Second

// Sentinel starts a SentinelGroup and waits until the replica is in sync
// and every Sentinel knows the replica and the two other Sentinels, so
// that a failover can start at once. Every process is killed when the
// test ends.
//
// Without redis-server on PATH the test fails with an install hint, or is
// skipped under -short.
func Sentinel(t testing.TB) *SentinelGroup {
	t.Helper()
	requireBinary(t, redisproc.Binary, "redis-server", testing.Short())
	master := startNode(t, &redisproc.Options{Args: replicaArgs})
	g := &SentinelGroup{Nodes: []*Node{master, Replica(t, master)}, t: t, clients: make(map[string]*redis.Client)}
	host, port, _ := net.SplitHostPort(master.Addr)
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 2\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s 10000\n", MasterName, host, port, DownAfter.Milliseconds())
	for range 3 {
		g.Sentinels = append(g.Sentinels, startNode(t, &redisproc.Options{Conf: conf, Args: []string{"--sentinel"}}))
	}
	for _, n := range append(slices.Clone(g.Nodes), g.Sentinels...) {
		g.clients[n.Addr] = n.Client()
	}
	g.await("every Sentinel to know the replica and the other Sentinels", func(ctx context.Context) error {
		for _, s := range g.Sentinels {
			if err := sentinelReady(ctx, g.clients[s.Addr]); err != nil {
				return fmt.Errorf("sentinel %s: %w", s.Addr, err)
			}
		}
		return nil
	})
	return g
}

// Replica starts a redis-server that replicates master and waits until it
// is in sync and acknowledges the master's writes (WAIT). It is killed
// when the test ends.
func Replica(t testing.TB, master *Node) *Node {
	t.Helper()
	requireBinary(t, redisproc.Binary, "redis-server", testing.Short())
	host, port, _ := net.SplitHostPort(master.Addr)
	r := startNode(t, &redisproc.Options{Args: append(slices.Clone(replicaArgs), "--replicaof", host, port)})
	mc := master.Client()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	for {
		info, err := mc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "port="+r.Addr[strings.LastIndexByte(r.Addr, ':')+1:]+",state=online") {
			var acks int64
			if acks, err = mc.Wait(ctx, 1, time.Second).Result(); err == nil && acks >= 1 {
				return r
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("redistest: replica %s of %s not in sync within %v: %v\n%s", r.Addr, master.Addr, sentinelTimeout, err, info)
		}
		time.Sleep(pollEvery) // polls the master
	}
}

// SentinelAddrs returns the Sentinels' addresses.
func (g *SentinelGroup) SentinelAddrs() []string {
	addrs := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		addrs[i] = s.Addr
	}
	return addrs
}

// Client returns go-redis' failover client of the group, which asks the
// Sentinels for the master, with ContextTimeoutEnabled set. It is closed
// when the test ends.
func (g *SentinelGroup) Client() *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            MasterName,
		SentinelAddrs:         g.SentinelAddrs(),
		ContextTimeoutEnabled: true,
	})
	g.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Master returns the data node that every Sentinel names as the master
// and that reports itself master, waiting while the group disagrees (a
// failover under way).
func (g *SentinelGroup) Master() *Node {
	g.t.Helper()
	var master *Node
	g.await("the Sentinels to agree on a master", func(ctx context.Context) error {
		var err error
		master, err = g.agreed(ctx)
		return err
	})
	return master
}

// Failover asks a Sentinel for a failover (SENTINEL FAILOVER), as an
// operator would, and waits until the group agrees on the replica as its
// new master, which it returns. A failover that the Sentinel abandons (a
// promotion not seen within its failover-timeout, on a busy machine) is
// asked for again, as an operator would: only while that Sentinel still
// names the old master, so that a failover that succeeded is never undone.
func (g *SentinelGroup) Failover() *Node {
	g.t.Helper()
	old := g.Master()
	asked := g.clients[g.Sentinels[0].Addr]
	var master *Node
	g.await("a master other than "+old.Addr+" after SENTINEL FAILOVER", func(ctx context.Context) error {
		m, err := g.agreed(ctx)
		if err == nil && m != old {
			master = m
			return nil
		}
		a, aerr := asked.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName).StringSlice()
		if aerr == nil && len(a) == 2 && net.JoinHostPort(a[0], a[1]) == old.Addr {
			// Refused with INPROG while a failover is under way.
			if ferr := asked.Do(ctx, "SENTINEL", "FAILOVER", MasterName).Err(); ferr != nil && !strings.Contains(ferr.Error(), "INPROG") {
				return fmt.Errorf("SENTINEL FAILOVER: %w", ferr)
			}
		}
		if err == nil {
			err = fmt.Errorf("%s is still the master", old.Addr)
		}
		return err
	})
	return master
}

// AwaitPromotion waits until the group agrees on a master other than old
// (after a failover, or old's death) and returns it.
func (g *SentinelGroup) AwaitPromotion(old *Node) *Node {
	g.t.Helper()
	var master *Node
	g.await("a master other than "+old.Addr, func(ctx context.Context) error {
		m, err := g.agreed(ctx)
		if err == nil && m == old {
			err = fmt.Errorf("%s is still the master", old.Addr)
		}
		master = m
		return err
	})
	return master
}

// agreed returns the data node that every Sentinel names as the master,
// if it reports itself master.
func (g *SentinelGroup) agreed(ctx context.Context) (*Node, error) {
	var addr string
	for _, s := range g.Sentinels {
		a, err := g.clients[s.Addr].Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName).StringSlice()
		if err != nil || len(a) != 2 {
			return nil, fmt.Errorf("sentinel %s: %v %v", s.Addr, a, err)
		}
		if got := net.JoinHostPort(a[0], a[1]); addr == "" {
			addr = got
		} else if got != addr {
			return nil, fmt.Errorf("sentinels name %s and %s", addr, got)
		}
	}
	i := slices.IndexFunc(g.Nodes, func(n *Node) bool { return n.Addr == addr })
	if i < 0 {
		return nil, fmt.Errorf("sentinels name %s, not a node of the group", addr)
	}
	info, err := g.clients[addr].Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(info, "role:master") {
		return nil, fmt.Errorf("%s is named but is not a master yet: %v", addr, err)
	}
	return g.Nodes[i], nil
}

// await polls check until it succeeds, or ends the test after
// sentinelTimeout with check's last error.
func (g *SentinelGroup) await(what string, check func(context.Context) error) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, pollTimeout) // a paused node must not hold the poll
		err := check(pctx)
		pcancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			g.t.Fatalf("redistest: no %s within %v: %v", what, sentinelTimeout, err)
		}
		time.Sleep(20 * pollEvery) // polls the group
	}
}

// sentinelReady reports, through a Sentinel's client, whether it knows the
// replica and enough Sentinels to authorise a failover.
func sentinelReady(ctx context.Context, c *redis.Client) error {
	if err := c.Do(ctx, "SENTINEL", "CKQUORUM", MasterName).Err(); err != nil {
		return err
	}
	others, err := c.Do(ctx, "SENTINEL", "SENTINELS", MasterName).Slice()
	if err != nil || len(others) != 2 {
		return fmt.Errorf("knows %d other sentinels (%v), want 2", len(others), err)
	}
	replicas, err := c.Do(ctx, "SENTINEL", "REPLICAS", MasterName).Slice()
	if err != nil || len(replicas) != 1 {
		return fmt.Errorf("knows %d replicas (%v), want 1", len(replicas), err)
	}
	if flags := fmt.Sprint(replicas[0]); strings.Contains(flags, "s_down") || strings.Contains(flags, "disconnected") {
		return fmt.Errorf("sees its replica as %s", flags)
	}
	return nil
}
