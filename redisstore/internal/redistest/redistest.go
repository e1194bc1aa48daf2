// Package redistest starts real redis-server processes on loopback ports for tests, and stops them when the test ends.
//
// The servers keep nothing on disk (no RDB snapshots, no append-only file), so
// a restarted server is empty. Only Unix-like systems are supported, as with
// redis-server itself. The processes are run by package redisproc; this
// package ends the test on errors and joins servers into a Cluster.
package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herdcache/herd/redisstore/redisproc"
	"github.com/redis/go-redis/v9"
)

const (
	// clusterTimeout bounds how long redis-cli --cluster create and the
	// nodes' reaching cluster_state:ok may take: generous, as redis-cli
	// polls the joining nodes once a second and a busy machine slows each
	// step (15s ran out once beside the rest of the suite).
	clusterTimeout = time.Minute
	// pollEvery is how often a forming cluster is probed.
	pollEvery = 5 * time.Millisecond
)

// clusterArgs run a server as a cluster node, keeping its cluster config in
// its working directory so that it survives Restart.
var clusterArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "5000",
}

// replicatedNodeTimeout is the cluster-node-timeout of ReplicatedCluster's
// nodes, in milliseconds: after a master stops answering for that long, its
// replica is promoted within about another second.
const replicatedNodeTimeout = "1000"

// Node is one redis-server process listening on 127.0.0.1. Its methods must
// be called from the test's goroutine, since they may end the test.
type Node struct {
	// Addr is the server's address, "127.0.0.1:<port>"; it stays the same
	// across Restart.
	Addr string

	t   testing.TB
	srv *redisproc.Server
}

// Server starts a redis-server on a free loopback port, with persistence off
// and its working directory in a temporary directory, and waits until it
// answers PING. The server is killed and its directory removed when the test
// ends, whether it passed or not.
//
// Without redis-server on PATH the test fails with an install hint, or is
// skipped under -short.
func Server(t testing.TB) *Node {
	t.Helper()
	requireBinary(t, redisproc.Binary, "redis-server", testing.Short())
	return startNode(t, nil)
}

// ClusterNodes is a Redis Cluster of three masters on loopback ports, each
// holding a third of the hash slots, without replicas unless made by
// ReplicatedCluster.
type ClusterNodes struct {
	// Nodes are the masters, in the order they were given to
	// redis-cli --cluster create.
	Nodes []*Node
	// Replicas, made by ReplicatedCluster, are the masters' replicas:
	// Replicas[i] replicates Nodes[i]. Nil for Cluster.
	Replicas []*Node

	t testing.TB
}

// Cluster starts three redis-server processes in cluster mode, joins them
// with redis-cli --cluster create and waits until every node reports
// cluster_state:ok. The nodes are killed when the test ends.
//
// Without redis-server or redis-cli on PATH the test fails with an install
// hint, or is skipped under -short.
func Cluster(t testing.TB) *ClusterNodes {
	t.Helper()
	return cluster(t, false)
}

// cluster starts three masters, each with a replica if replicated, joins
// them and waits until every node reports cluster_state:ok.
func cluster(t testing.TB, replicated bool) *ClusterNodes {
	t.Helper()
	requireBinary(t, redisproc.Binary, "redis-server", testing.Short())
	cli := requireBinary(t, "redis-cli", "redis-tools", testing.Short())
	c := &ClusterNodes{t: t}
	nodes := 3
	if replicated {
		nodes = 6
	}
	nodeArgs := clusterArgs
	if replicated {
		nodeArgs = append(slices.Clone(clusterArgs), "--cluster-node-timeout", replicatedNodeTimeout) // the last one counts
	}
	var all []*Node
	for range nodes {
		all = append(all, startNode(t, &redisproc.Options{Args: nodeArgs, ClusterBus: true}))
	}
	c.Nodes = all[:3]

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := []string{"--cluster", "create"}
	for _, n := range all {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(nodes/3-1), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for _, n := range all {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true})
		defer cl.Close()
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("redistest: cluster node %s not ok within %v: %q, %v", n.Addr, clusterTimeout, info, err)
			case <-tick.C:
			}
		}
	}
	if replicated {
		c.Nodes, c.Replicas = pairReplicas(ctx, t, all)
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *ClusterNodes) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a cluster client of the nodes that honours context
// deadlines (ContextTimeoutEnabled). It is closed when the test ends.
func (c *ClusterNodes) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 c.Addrs(),
		ContextTimeoutEnabled: true,
	})
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Client returns a client of the node that honours context deadlines
// (ContextTimeoutEnabled). It is closed when the test ends.
func (n *Node) Client() *redis.Client {
	cl := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true})
	n.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Kill stops the server with SIGKILL, as a crash would, and waits until it
// has exited. Killing a stopped server does nothing.
func (n *Node) Kill() { n.srv.Kill() }

// Restart starts the server again on the same port, killing it first if it
// is running, and waits until it answers PING. It starts empty.
func (n *Node) Restart() {
	n.t.Helper()
	if err := n.srv.Restart(context.Background()); err != nil {
		n.t.Fatalf("redistest: %v", err)
	}
}

// Pause freezes the server with SIGSTOP: connections are accepted by the
// kernel but nothing is answered, as with a server stuck in a long pause.
func (n *Node) Pause() {
	n.t.Helper()
	if err := n.srv.Pause(); err != nil {
		n.t.Fatalf("redistest: %v", err)
	}
}

// Resume lets a paused server run again with SIGCONT.
func (n *Node) Resume() {
	n.t.Helper()
	if err := n.srv.Resume(); err != nil {
		n.t.Fatalf("redistest: %v", err)
	}
}

// startNode starts a server run as o says and stops it when the test ends.
func startNode(t testing.TB, o *redisproc.Options) *Node {
	t.Helper()
	srv, err := redisproc.StartWith(context.Background(), o)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("redistest: %v", err)
		}
	})
	return &Node{Addr: srv.Addr(), t: t, srv: srv}
}

// requireBinary returns the path of the named program, or ends the test:
// skipped under short, failed otherwise, with a hint to install pkg.
func requireBinary(t testing.TB, name, pkg string, short bool) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("redistest: %s is not on PATH (%v); these tests start real Redis servers: install it, e.g. apt-get install %s", name, err, pkg)
	if short {
		t.Skip(msg)
	}
	t.Fatal(msg)
	return ""
}
