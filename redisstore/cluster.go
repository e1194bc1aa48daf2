package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster slot map and subscription recovery.
const (
	// reloadEvery is the least time between two reloads of a Cluster's slot
	// map that errors ask for.
	reloadEvery = 250 * time.Millisecond
	// pingEvery is how long the subscription may stay quiet before it is
	// pinged, so that a connection that broke without a word is found.
	pingEvery = 3 * time.Second
	// resubscribeMin and resubscribeMax bound the pause after a failed
	// receive on the subscription, which doubles with each failure in a row.
	resubscribeMin = 10 * time.Millisecond
	resubscribeMax = 250 * time.Millisecond
)

// reload has a Cluster client reload its slot map, at most once per
// reloadEvery, after err, if err may mean that the map is out of date: a
// connection or timeout error (a master died, or is being replaced), or a
// CLUSTERDOWN, MOVED, ASK, TRYAGAIN or READONLY reply. go-redis reloads on
// its own only after MOVED and ASK, or once a minute, so without this a
// client keeps dialling a master that died until then, though the Cluster
// promoted its replica within cluster-node-timeout. The reload runs in the
// background.
func (r *Remote) reload(err error) {
	if r.cluster == nil || !staleMap(err) {
		return
	}
	now := int64(time.Since(r.born))
	last := r.reloadedAt.Load()
	if last != 0 && now-last < int64(reloadEvery) || !r.reloadedAt.CompareAndSwap(last, now) {
		return
	}
	r.cluster.ReloadState(context.Background())
}

// staleMap reports whether err, from a Redis call on a Cluster, may mean
// that the client's slot map is out of date.
func staleMap(err error) bool {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, context.Canceled), errors.Is(err, redis.ErrClosed):
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true // the connection failed or timed out
	}
	for _, p := range []string{"CLUSTERDOWN", "MOVED ", "ASK ", "TRYAGAIN", "READONLY"} {
		if redis.HasErrorPrefix(reply, p) {
			return true
		}
	}
	return false
}

// listen hands the subscription's messages on until Close. A receive that
// fails (the connection broke, or its master died) is retried after a
// pause that grows from resubscribeMin to resubscribeMax, and on a Cluster
// has the slot map reloaded, so that the PubSub, which resubscribes on its
// next receive, dials the node that now holds the channel's slot.
func (r *Remote) listen(ctx context.Context) {
	defer close(r.listening)
	pause := time.Duration(0)
	for {
		m, err := r.pubsub.ReceiveTimeout(ctx, pingEvery)
		if err != nil {
			if r.closed.Load() || errors.Is(err, redis.ErrClosed) || ctx.Err() != nil {
				return
			}
			if isTimeout(err) && pause == 0 {
				_ = r.pubsub.Ping(ctx) // a broken connection fails the ping or the next receive
				continue
			}
			r.reload(err)
			pause = min(max(2*pause, resubscribeMin), resubscribeMax)
			if !sleep(ctx, pause) {
				return
			}
			continue
		}
		pause = 0
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				r.subscribed()
			}
		case *redis.Message:
			r.dispatch(m.Payload)
		}
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// sleep waits for d, or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
