package redisstore

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/notify"
)

// Proofs of liveness ([remote.LiveNotifier]); see "A live channel" in the
// package doc.

// DefaultLivePeriod is the recommended Options.LivePeriod.
const DefaultLivePeriod = time.Second

// liveNotice is the first byte of a heartbeat: "h<sequence>:<ms>", the
// sequence number that the live script gave it and the server's clock, in
// Unix milliseconds, when it was published.
const liveNotice = 'h'

// liveSeqTTL is the least TTL of the heartbeats' sequence key: a fleet
// silent that long starts again from 1, which its subscribers take for a
// gap.
const liveSeqTTL = time.Minute

var liveScript = redis.NewScript(embedded("live"))

// liveNames returns the names of the heartbeats' sequence key and of their
// gate, which share one hash slot.
func (r *Remote) liveNames() (seq, gate string) {
	p := r.space.Prefix() + "{live}:"
	return p + "s", p + "g"
}

// SubscribeLive does what Subscribe does, and hands fn a proof of
// liveness after each heartbeat that follows the one before it on the
// channel with no gap in their sequence: a Notice whose Live is the
// heartbeat's time on the server's clock (or this replica's, if that is
// earlier) plus twice the period. A gap (a heartbeat lost), a sequence
// that went back (its key lost) or a reconnection hands every subscriber
// the zero Notice first. Without Options.LivePeriod, or on a Cluster, fn
// gets no proof.
func (r *Remote) SubscribeLive(fn func(remote.Notice)) (stop func()) {
	return r.subscribe(fn, r.livePeriod > 0)
}

// subscribe starts a subscription for fn; live subscriptions get proofs.
func (r *Remote) subscribe(fn func(remote.Notice), live bool) (stop func()) {
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return func() {}
	}
	s := notify.Start(func(n notify.Notice) { fn(remote.Notice(n)) }, subscribeQueue)
	r.subs[s] = live
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.subs, s)
		r.mu.Unlock()
		s.Stop()
	}
}

// heard handles a heartbeat from the channel; it ignores one it cannot
// parse, and all of them when live proofs are off.
func (r *Remote) heard(payload string) {
	if r.livePeriod <= 0 {
		return
	}
	seq, ms, ok := parseLive(payload)
	if !ok {
		return
	}
	select {
	case r.heardBeat <- struct{}{}: // this Remote's next heartbeat waits a period
	default:
	}
	now := time.Now()
	made := time.UnixMilli(int64(ms))
	if made.After(now) {
		made = now // a server clock ahead of this one's
	}
	live := made.Add(2 * r.livePeriod)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastBeat != 0 && seq != r.lastBeat+1 {
		for s := range r.subs {
			s.Push(notify.Notice{}) // a heartbeat, so perhaps a notice, was lost
		}
		r.waits.WakeAll()
	}
	r.lastBeat = seq
	if !now.Before(live) {
		return // made too long ago to prove anything
	}
	for s, isLive := range r.subs {
		if isLive {
			s.Push(notify.Notice{Live: live})
		}
	}
}

// parseLive parses a heartbeat, "h<sequence>:<ms>", both canonical
// decimals past 0.
func parseLive(p string) (seq, ms uint64, ok bool) {
	rest, found := strings.CutPrefix(p, string(rune(liveNotice)))
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, ":")
	if !found {
		return 0, 0, false
	}
	if seq, ok = positive(a); !ok {
		return 0, 0, false
	}
	if ms, ok = positive(b); !ok {
		return 0, 0, false
	}
	return seq, ms, true
}

// positive parses a canonical decimal past 0 and below 2^53.
func positive(s string) (uint64, bool) {
	if s == "" || s[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > envelope.MaxFence {
		return 0, false
	}
	return n, true
}

// beat publishes this Remote's heartbeats until ctx ends: one a period
// and a random part of half a period after the last it published or
// heard, so that the fleet's Remotes take turns and the channel carries
// about one a period (the live script's gate drops the second of two sent
// within half a period of each other).
func (r *Remote) beat(ctx context.Context) {
	defer close(r.beating)
	t := time.NewTimer(r.nextBeat())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.heardBeat:
		case <-t.C:
			r.publishBeat(ctx)
		}
		t.Reset(r.nextBeat())
	}
}

// nextBeat returns how long this Remote waits for a heartbeat before it
// publishes one.
func (r *Remote) nextBeat() time.Duration {
	return r.livePeriod + rand.N(r.livePeriod/2+1)
}

// publishBeat runs the live script once, within Timeout.
func (r *Remote) publishBeat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	seq, gate := r.liveNames()
	half := max(r.livePeriod.Milliseconds()/2, 1)
	ttl := max(liveSeqTTL, 10*r.livePeriod).Milliseconds()
	if err := liveScript.Run(ctx, r.client, []string{seq, gate}, r.channel, half, ttl).Err(); err != nil {
		r.reload(err)
	}
}
