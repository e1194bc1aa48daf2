package redisstore

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Notices on a Cluster; see "Notices on a Cluster" in the package doc.
//
// Classic PUBLISH on a Cluster is relayed by the master that ran it to
// every other node over the cluster bus, so each change costs every master
// a message. A shard channel lives on the master of its hash slot alone,
// and a script may SPUBLISH only to a shard channel whose slot is on its
// own master. So a Remote on a Cluster subscribes to shardChannels shard
// channels, whose slots are spread over the slot space so that every
// master of a Cluster whose masters hold slot ranges of at least
// 16384/shardChannels slots holds one, and a key's scripts announce its
// notices on a shard channel held by the key's own master, chosen from
// the client's slot map (noticeChannel). The scripts fall back to classic
// PUBLISH, which every Remote also hears, when the map was out of date,
// and noticeChannel when the key's master holds none.

// shardTags are the hash tags of the shard channels: "n<digits>", the
// first whose slot is 1024 + 2048·i. The slot of each is checked against
// Redis' CLUSTER KEYSLOT by the tests.
var shardTags = [...]string{"n4868", "n12242", "n23577", "n9609", "n16871", "n5529", "n43826", "n2160"}

// shardChannelNames returns the shard channels of the notice channel
// channel: channel{<tag>} for each of shardTags. The prefix, and so
// channel, holds no brace, so the tag is each name's slot.
func shardChannelNames(channel string) []string {
	names := make([]string, len(shardTags))
	for i, tag := range shardTags {
		names[i] = channel + "{" + tag + "}"
	}
	return names
}

// isShardChannel reports whether ch names a shard channel: it is the only
// kind of channel name with a brace.
func isShardChannel(ch string) bool { return strings.IndexByte(ch, '{') >= 0 }

// noticeChannel returns the channel a script announces the notices of the
// key whose Redis name (any of its Names) is name on: the first shard
// channel whose slot is on the key's master by the client's slot map, or
// the classic channel when there are no shard channels (not a Cluster, or
// ClassicNotices), the map cannot be had, or no shard channel's slot is
// on that master.
func (r *Remote) noticeChannel(ctx context.Context, name string) string {
	if r.shardChannels == nil {
		return r.channel
	}
	m, err := r.cluster.MasterForKey(ctx, name)
	if err != nil {
		return r.channel
	}
	addr := m.Options().Addr
	for _, ch := range r.shardChannels {
		if c, err := r.cluster.MasterForKey(ctx, ch); err == nil && c.Options().Addr == addr {
			return ch
		}
	}
	return r.channel
}

// publish sends msg on ch as the scripts' publish does: with SPUBLISH on a
// shard channel (go-redis sends it to the channel's master, wherever that
// is), and with PUBLISH on the classic channel otherwise or when that
// fails.
func (r *Remote) publish(ctx context.Context, ch, msg string) error {
	if isShardChannel(ch) {
		if err := r.client.SPublish(ctx, ch, msg).Err(); err == nil {
			return nil
		}
	}
	return r.client.Publish(ctx, r.channel, msg).Err()
}

// A listener is one of a Remote's subscriptions, read by its own listen
// goroutine: to the classic channel, or to one shard channel.
type listener struct {
	// shard is the shard channel; empty for the classic channel.
	shard string
	mu    sync.Mutex
	// ps is the subscription; renew replaces a shard channel's, and close
	// closes it for good.
	ps     *redis.PubSub
	closed bool
}

// pubsub returns l's current subscription.
func (l *listener) pubsub() *redis.PubSub {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ps
}

// renew replaces l's subscription to its shard channel with a new one,
// which dials the master that c's slot map now gives the channel's slot:
// Redis unsubscribed the old one when the slot left its master, or
// answered it with MOVED, after which a PubSub does not reconnect on its
// own. It does nothing once l is closed.
func (l *listener) renew(ctx context.Context, c *redis.ClusterClient) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	_ = l.ps.Close()
	l.ps = c.SSubscribe(ctx, l.shard) // a failed SSUBSCRIBE is sent again by the next receive
}

// close closes l's subscription for good.
func (l *listener) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.ps.Close()
}
