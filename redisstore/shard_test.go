package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote/keyspace"
	"github.com/herdcache/herd/remote/notify"
)

// TestShardTags checks that the shard channels' slots are spread over the
// slot space as shard.go says: 1024 + 2048·i.
func TestShardTags(t *testing.T) {
	for i, ch := range shardChannelNames(DefaultPrefix + "events") {
		if got, want := keyspace.Slot(ch), uint16(1024+2048*i); got != want {
			t.Errorf("shard channel %q is on slot %d, want %d", ch, got, want)
		}
		if !isShardChannel(ch) || strings.Count(ch, "{") != 1 {
			t.Errorf("shard channel %q is not told apart from the channel by its one brace", ch)
		}
	}
	if isShardChannel(DefaultPrefix + "events") {
		t.Error("the classic channel counts as a shard channel")
	}
}

// busPublishes returns how many classic PUBLISH messages the Cluster's
// nodes have relayed to each other over the cluster bus since they
// started (CLUSTER INFO cluster_stats_messages_publish_sent, summed).
func busPublishes(t *testing.T, nodes []*redis.Client) int {
	t.Helper()
	sum := 0
	for _, n := range nodes {
		info, err := n.ClusterInfo(t.Context()).Result()
		if err != nil {
			t.Fatalf("CLUSTER INFO: %v", err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_stats_messages_publish_sent:"); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("CLUSTER INFO: %q", line)
				}
				sum += n
			}
		}
	}
	return sum
}

// nodeClients returns a client of each of c's masters.
func nodeClients(c *redistest.ClusterNodes) []*redis.Client {
	var cs []*redis.Client
	for _, n := range c.Nodes {
		cs = append(cs, n.Client())
	}
	return cs
}

// keysOnEveryMaster returns n keys, at least one of whose slots is on each
// of c's masters, by cc's slot map.
func keysOnEveryMaster(t *testing.T, c *redistest.ClusterNodes, cc *redis.ClusterClient, r *Remote, prefix string, n int) []string {
	t.Helper()
	masters := make(map[string]bool)
	var keys []string
	for i := 0; i < n; i++ {
		k := fmt.Sprint(prefix, i)
		m, err := cc.MasterForKey(t.Context(), r.space.Names(k).Value)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
		keys = append(keys, k)
	}
	if len(masters) != len(c.Nodes) {
		t.Fatalf("%d keys reach %d of %d masters", n, len(masters), len(c.Nodes))
	}
	return keys
}

// TestShardedNotices checks that on a Cluster every notice of a key (a Set,
// a MarkStale, an Invalidate, a write-back and the completion that Wait
// hears) reaches another Remote's subscribers, for keys on every master,
// and that none of them crosses the cluster bus, where with
// ClassicNotices each one is relayed to both other masters.
func TestShardedNotices(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t)
	cc := c.Client()
	nodes := nodeClients(c)
	for _, classic := range []bool{false, true} {
		prefix := fmt.Sprintf("classic=%v:", classic)
		writer := newRemote(t, cc, Options{Prefix: prefix, ClassicNotices: classic})
		reader := newRemote(t, cc, Options{Prefix: prefix, ClassicNotices: classic})
		notices := subscribe(t, reader)
		registered := make(chan string, 1)
		reader.onWait = func(k string) { registered <- k }
		keys := keysOnEveryMaster(t, c, cc, writer, "k/", 12)
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()

		before := busPublishes(t, nodes)
		var want []notify.Notice
		for _, k := range keys {
			f1, err := writer.Set(ctx, k, fresh("s"), time.Minute)
			if err != nil {
				t.Fatalf("Set(%q): %v", k, err)
			}
			f2, err := writer.MarkStale(ctx, k)
			if err != nil {
				t.Fatalf("MarkStale(%q): %v", k, err)
			}
			if err := writer.Invalidate(ctx, k); err != nil {
				t.Fatalf("Invalidate(%q): %v", k, err)
			}
			g, err := writer.Acquire(ctx, k, time.Minute, time.Time{})
			if err != nil || g.Token == "" {
				t.Fatalf("Acquire(%q) = %+v, %v; want the lease", k, g, err)
			}
			woken := make(chan error, 1)
			go func() { woken <- reader.Wait(ctx, k) }()
			<-registered
			if ok, err := writer.WriteRelease(ctx, k, fresh("w"), g.Fence, time.Minute, g.Token); !ok || err != nil {
				t.Fatalf("WriteRelease(%q) = %v, %v", k, ok, err)
			}
			if err := <-woken; err != nil {
				t.Fatalf("Wait(%q) for the writer's completion: %v", k, err)
			}
			want = append(want, notify.Notice{Key: k, Fence: f1}, notify.Notice{Key: k, Fence: f2},
				notify.Notice{Key: k, Fence: f2 + 1, Dropped: true}, notify.Notice{Key: k, Fence: g.Fence})
		}
		// Each key's notices are on one channel, so they come in order;
		// the Invalidate's fence is read from its notice.
		got := make(map[string][]notify.Notice)
		for range want {
			n := plain(next(t, notices))
			got[n.Key] = append(got[n.Key], n)
		}
		for i := 0; i < len(want); i += 4 {
			k := want[i].Key
			if len(got[k]) == 4 && got[k][2].Dropped && got[k][2].Fence > want[i+1].Fence {
				want[i+2].Fence = got[k][2].Fence
			}
			if fmt.Sprint(got[k]) != fmt.Sprint(want[i:i+4]) {
				t.Errorf("classic %v: notices of %q: %+v, want %+v", classic, k, got[k], want[i:i+4])
			}
		}
		// Six messages a key: the four above, the lease's hold and the
		// completion.
		relayed := busPublishes(t, nodes) - before
		if wantRelayed := 6 * len(keys) * (len(c.Nodes) - 1); classic && relayed != wantRelayed {
			t.Errorf("ClassicNotices: the masters relayed %d PUBLISH messages over the bus, want %d", relayed, wantRelayed)
		} else if !classic && relayed != 0 {
			t.Errorf("shard channels: the masters relayed %d PUBLISH messages over the bus, want none", relayed)
		}
	}
}

// TestShardPublishFallback checks the scripts' fallback: a notice on a
// shard channel whose slot is not on the key's master (the caller's slot
// map was out of date) goes out with classic PUBLISH, and still reaches
// the subscribers; on one that is, it does not cross the bus.
func TestShardPublishFallback(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t)
	cc := c.Client()
	nodes := nodeClients(c)
	r := newRemote(t, cc, Options{Prefix: "fallback:"})
	notices := subscribe(t, r)
	ctx := t.Context()
	const key = "k"
	n := r.space.Names(key)
	master, err := cc.MasterForKey(ctx, n.Value)
	if err != nil {
		t.Fatal(err)
	}
	var local, foreign string
	for _, ch := range r.shardChannels {
		m, err := cc.MasterForKey(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == master.Options().Addr {
			local = cmp.Or(local, ch)
		} else {
			foreign = cmp.Or(foreign, ch)
		}
	}
	if local == "" || foreign == "" {
		t.Fatalf("no shard channel on the key's master (%q) or none elsewhere (%q)", local, foreign)
	}
	for _, tc := range []struct {
		ch      string
		relayed int
	}{{local, 0}, {foreign, len(c.Nodes) - 1}} {
		before := busPublishes(t, nodes)
		f, err := setScript.Run(ctx, cc, []string{n.Value, n.Fence}, 60000, fresh("v"), tc.ch, key, r.fenceTTL(60000)).Int64()
		if err != nil {
			t.Fatalf("set script announcing on %q: %v", tc.ch, err)
		}
		if got := plain(next(t, notices)); got != (notify.Notice{Key: key, Fence: uint64(f)}) {
			t.Fatalf("announced on %q: notice %+v, want %q under fence %d", tc.ch, got, key, f)
		}
		if got := busPublishes(t, nodes) - before; got != tc.relayed {
			t.Errorf("announced on %q: %d messages over the bus, want %d", tc.ch, got, tc.relayed)
		}
	}
}

// TestShardChannelMoves moves the slots of every shard channel on one
// master to another, as a reshard does: Redis ends those subscriptions,
// and each Remote subscribes again on the new master, telling its
// subscribers to drop everything; notices of keys on the master left with
// no shard channel go out with classic PUBLISH, and those of keys on the
// others on their shard channels, and all of them arrive.
func TestShardChannelMoves(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t)
	cc := c.Client()
	const prefix = "moves:"
	writer := newRemote(t, cc, Options{Prefix: prefix})
	reader := newRemote(t, cc, Options{Prefix: prefix})
	notices := subscribe(t, reader)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()

	// source is a master that holds shard channels; target another.
	owners := make(map[string][]string)
	for _, ch := range reader.shardChannels {
		m, err := cc.MasterForKey(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		owners[m.Options().Addr] = append(owners[m.Options().Addr], ch)
	}
	var source, target *redistest.Node
	for _, n := range c.Nodes {
		switch {
		case source == nil && len(owners[n.Addr]) > 0:
			source = n
		case target == nil:
			target = n
		}
	}
	moved := owners[source.Addr]
	for _, ch := range moved {
		moveEmptySlot(ctx, t, c, int(keyspace.Slot(ch)), source, target)
	}

	// Both Remotes subscribe on target again: poll the target's count.
	onTarget := target.Client()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for _, ch := range moved {
		for {
			subs, err := onTarget.PubSubShardNumSub(ctx, ch).Result()
			if err != nil {
				t.Fatalf("PUBSUB SHARDNUMSUB on the target: %v", err)
			}
			if subs[ch] == 2 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("shard channel %q has %d subscribers on its new master, want both Remotes", ch, subs[ch])
			case <-tick.C:
			}
		}
	}
	if n := next(t, notices); n != (notify.Notice{}) {
		t.Fatalf("first notice after the move: %+v, want the zero Notice (drop everything)", n)
	}
	// Redis delivers on the renewed subscriptions. Each renewed
	// subscription also hands on one zero Notice (drop everything), which
	// may still be on its way on a busy machine: those are skipped, any
	// other notice fails.
	for i, ch := range moved {
		msg := "c" + strconv.Itoa(i+1) + ":direct"
		if err := cc.SPublish(ctx, ch, msg).Err(); err != nil {
			t.Fatalf("SPUBLISH %q: %v", ch, err)
		}
		n := next(t, notices)
		for n == (notify.Notice{}) {
			n = next(t, notices)
		}
		if n != (notify.Notice{Key: "direct", Fence: uint64(i + 1)}) {
			t.Fatalf("SPUBLISH %q %q: notice %+v", ch, msg, n)
		}
	}
	// And the writer's notices of keys on every master reach the reader.
	heardOnEveryMaster(t, c, cc, writer, notices)
}

// heardOnEveryMaster Sets keys on every master of c through writer and
// checks that notices hears each one's notice, in order.
func heardOnEveryMaster(t *testing.T, c *redistest.ClusterNodes, cc *redis.ClusterClient, writer *Remote, notices <-chan notify.Notice) {
	t.Helper()
	for _, k := range keysOnEveryMaster(t, c, cc, writer, "k/", 12) {
		f, err := writer.Set(t.Context(), k, fresh("v"), time.Minute)
		if err != nil {
			t.Fatalf("Set(%q): %v", k, err)
		}
		if n := plain(next(t, notices)); n != (notify.Notice{Key: k, Fence: f}) {
			t.Fatalf("Set(%q): notice %+v, want fence %d", k, n, f)
		}
	}
}

// moveEmptySlot moves slot, which holds no key, from source to target on
// every node, as redis-cli --cluster reshard does.
func moveEmptySlot(ctx context.Context, t *testing.T, c *redistest.ClusterNodes, slot int, source, target *redistest.Node) {
	t.Helper()
	src, dst := source.Client(), target.Client()
	sourceID, err1 := src.ClusterMyID(ctx).Result()
	targetID, err2 := dst.ClusterMyID(ctx).Result()
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if keys, err := src.ClusterCountKeysInSlot(ctx, slot).Result(); err != nil || keys != 0 {
		t.Fatalf("slot %d holds %d keys (%v), want none", slot, keys, err)
	}
	setSlot := func(n *redis.Client, args ...any) {
		t.Helper()
		if err := n.Do(ctx, append([]any{"CLUSTER", "SETSLOT", slot}, args...)...).Err(); err != nil {
			t.Fatalf("CLUSTER SETSLOT %d %v on %s: %v", slot, args, n.Options().Addr, err)
		}
	}
	setSlot(dst, "IMPORTING", sourceID)
	setSlot(src, "MIGRATING", targetID)
	setSlot(dst, "NODE", targetID)
	setSlot(src, "NODE", targetID)
	for _, n := range c.Nodes {
		if n != source && n != target {
			setSlot(n.Client(), "NODE", targetID)
		}
	}
}

// TestShardSubscriptionsKilled kills every subscription's connection on
// every master of a Cluster (CLIENT KILL TYPE pubsub): each of a Remote's
// subscriptions, the channel's and the shard channels', reconnects and
// hands its subscribers the zero Notice (drop everything), and the
// notices of keys on every master are heard again.
func TestShardSubscriptionsKilled(t *testing.T) {
	t.Parallel()
	c := redistest.Cluster(t)
	cc := c.Client()
	writer := newRemote(t, cc, Options{Prefix: "killed:"})
	reader := newRemote(t, cc, Options{Prefix: "killed:"})
	notices := subscribe(t, reader)
	ctx := t.Context()
	for _, n := range nodeClients(c) {
		if err := n.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatalf("CLIENT KILL TYPE pubsub on %s: %v", n.Options().Addr, err)
		}
	}
	for i := range len(reader.listeners) {
		if n := next(t, notices); n != (notify.Notice{}) {
			t.Fatalf("notice %d after the kill: %+v, want the zero Notice", i, n)
		}
	}
	heardOnEveryMaster(t, c, cc, writer, notices)
}
