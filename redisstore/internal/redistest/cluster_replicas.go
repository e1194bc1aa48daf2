package redistest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReplicatedCluster is Cluster with a replica for each master, six
// redis-server processes in all; it waits until each replica is in sync
// and acknowledges its master's writes (WAIT). Replicas[i] replicates
// Nodes[i]. Its nodes run with a cluster-node-timeout of one second, so
// that a master that dies is replaced within a few seconds (see
// AwaitPromotion). The nodes are killed when the test ends.
func ReplicatedCluster(t testing.TB) *ClusterNodes {
	t.Helper()
	return cluster(t, true)
}

// pairReplicas splits nodes into masters and their replicas, ordered
// alike, once each replica is in sync and acknowledges writes, or ends
// the test.
func pairReplicas(ctx context.Context, t testing.TB, nodes []*Node) (masters, replicas []*Node) {
	t.Helper()
	var others []*Node
	for _, n := range nodes {
		info, err := n.Client().Info(ctx, "replication").Result()
		if err != nil {
			t.Fatalf("redistest: cluster node %s: %v", n.Addr, err)
		}
		if strings.Contains(info, "role:master") {
			masters = append(masters, n)
		} else {
			others = append(others, n)
		}
	}
	replicas = make([]*Node, len(masters))
	clients := make([]*redis.Client, len(masters))
	for i, m := range masters {
		clients[i] = m.Client()
	}
	for _, r := range others {
		rc := r.Client()
		for {
			info, err := rc.Info(ctx, "replication").Result()
			i := masterOf(info, masters)
			if err == nil && i >= 0 && replicas[i] == nil && strings.Contains(info, "master_link_status:up") {
				if acks, err := clients[i].Wait(ctx, 1, time.Second).Result(); err == nil && acks >= 1 {
					replicas[i] = r
					break
				}
			}
			if ctx.Err() != nil {
				t.Fatalf("redistest: cluster replica %s not in sync within %v: %v\n%s", r.Addr, clusterTimeout, err, info)
			}
			time.Sleep(20 * pollEvery) // polls the replica
		}
	}
	for i, r := range replicas {
		if r == nil {
			t.Fatalf("redistest: cluster master %s has no replica", masters[i].Addr)
		}
	}
	return masters, replicas
}

// masterOf returns the index of the master that a replica's INFO
// replication names, or -1.
func masterOf(info string, masters []*Node) int {
	for i, m := range masters {
		if strings.Contains(info, "master_port:"+m.Addr[strings.LastIndexByte(m.Addr, ':')+1:]+"\r\n") {
			return i
		}
	}
	return -1
}

// AwaitPromotion waits until Replicas[i] has been promoted in place of its
// master (after Nodes[i].Kill, say): it reports role:master and
// cluster_state:ok. It ends the test if that takes longer than
// clusterTimeout. It returns the promoted node.
func (c *ClusterNodes) AwaitPromotion(i int) *Node {
	c.t.Helper()
	r := c.Replicas[i]
	cl := redis.NewClient(&redis.Options{Addr: r.Addr, ContextTimeoutEnabled: true})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	for {
		info, err := cl.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			if info, err = cl.ClusterInfo(ctx).Result(); err == nil && strings.Contains(info, "cluster_state:ok") {
				return r
			}
		}
		if ctx.Err() != nil {
			c.t.Fatalf("redistest: replica %s not promoted within %v: %v\n%s", r.Addr, clusterTimeout, err, info)
		}
		time.Sleep(pollEvery) // polls the replica
	}
}
