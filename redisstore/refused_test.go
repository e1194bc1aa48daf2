package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/redisstore/internal/redistest"
	"github.com/herdcache/herd/remote"
)

// refusedLease is the lease TTL of the tests of refused writes: far longer
// than they wait for a completion, so that no wait can end by the lease
// expiring.
const refusedLease = 10 * time.Second

// waitFor starts waiter.Wait(key) and returns once it is registered; the
// channel gets its result, which must come well before refusedLease.
func waitFor(t *testing.T, waiter *Remote, registered chan string, key string) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), refusedLease/2)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- waiter.Wait(ctx, key)
	}()
	if got := <-registered; got != key {
		t.Fatalf("Wait registered %q, want %q", got, key)
	}
	return done
}

// woken fails the test unless the Wait behind done ended with no error,
// which a completion notice does (its ctx would end it first otherwise,
// at refusedLease/2).
func woken(t *testing.T, done <-chan error, what string) {
	t.Helper()
	if err := <-done; err != nil {
		t.Errorf("Wait after %s: %v; want woken by its completion", what, err)
	}
}

// leaseHeld reports whether key's lease key exists.
func leaseHeld(t *testing.T, c redis.UniversalClient, r *Remote, key string) bool {
	t.Helper()
	n, err := c.Exists(t.Context(), r.space.Names(key).Lease).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// acquireAll takes the leases of keys on r and returns their grants.
func acquireAll(t *testing.T, r *Remote, keys ...string) map[string]remote.Grant {
	t.Helper()
	gs := map[string]remote.Grant{}
	for _, k := range keys {
		g, err := r.Acquire(t.Context(), k, refusedLease, time.Time{})
		if err != nil || g.Token == "" {
			t.Fatalf("Acquire(%q) = %+v, %v", k, g, err)
		}
		gs[k] = g
	}
	return gs
}

// TestWriteRefusedWhenFull checks that a write-back Redis refuses for want
// of memory (maxmemory reached under noeviction) still drops the lease and
// announces the completion, so that a Wait-er on another Remote is woken
// at once, and returns an error wrapping ErrWriteFailed; and that Release
// works when Redis is full.
func TestWriteRefusedWhenFull(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	c := n.Client()
	holder := newRemote(t, n.Client(), Options{})
	waiter := newRemote(t, n.Client(), Options{})
	registered := make(chan string, 1)
	waiter.onWait = func(key string) { registered <- key }
	ctx := t.Context()
	gs := acquireAll(t, holder, "one", "many1", "many2", "release", "release-many")

	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[0], kv[1], err)
		}
	}
	if err := c.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("SET when full: %v; want an OOM error", err)
	}

	done := waitFor(t, waiter, registered, "one")
	g := gs["one"]
	wrote, err := holder.WriteRelease(ctx, "one", fresh("v"), g.Fence, time.Minute, g.Token)
	t.Logf("WriteRelease when full: %v, %v", wrote, err)
	if wrote || !errors.Is(err, ErrWriteFailed) || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("WriteRelease when full = %v, %v; want false and an OOM error wrapping ErrWriteFailed", wrote, err)
	}
	woken(t, done, "WriteRelease when full")
	if leaseHeld(t, c, holder, "one") {
		t.Error("WriteRelease when full left the lease held")
	}

	done = waitFor(t, waiter, registered, "many2")
	var writes []remote.HeldWrite
	for _, k := range []string{"many1", "many2"} {
		writes = append(writes, remote.HeldWrite{HeldKey: remote.HeldKey{Key: k, Token: gs[k].Token}, Env: fresh("v"), Fence: gs[k].Fence, TTL: time.Minute})
	}
	for i, o := range holder.WriteReleaseMany(ctx, writes) {
		if o.OK || !errors.Is(o.Err, ErrWriteFailed) || !strings.Contains(o.Err.Error(), "OOM") {
			t.Errorf("WriteReleaseMany when full: %q = %+v; want an OOM error wrapping ErrWriteFailed", writes[i].Key, o)
		}
		if leaseHeld(t, c, holder, writes[i].Key) {
			t.Errorf("WriteReleaseMany when full left the lease of %q held", writes[i].Key)
		}
	}
	woken(t, done, "WriteReleaseMany when full")

	done = waitFor(t, waiter, registered, "release")
	if err := holder.Release(ctx, "release", gs["release"].Token); err != nil {
		t.Errorf("Release when full: %v", err)
	}
	woken(t, done, "Release when full")
	done = waitFor(t, waiter, registered, "release-many")
	rel := remote.HeldWrite{HeldKey: remote.HeldKey{Key: "release-many", Token: gs["release-many"].Token}}
	if o := holder.WriteReleaseMany(ctx, []remote.HeldWrite{rel})[0]; o.Err != nil {
		t.Errorf("WriteReleaseMany's release when full: %+v", o)
	}
	woken(t, done, "WriteReleaseMany's release when full")
	for _, k := range []string{"release", "release-many"} {
		if leaseHeld(t, c, holder, k) {
			t.Errorf("release of %q when full left its lease held", k)
		}
	}
	for _, k := range []string{"one", "many1", "many2"} {
		if b, err := holder.Load(ctx, k); b != nil || err != nil {
			t.Errorf("Load(%q) after a refused write = %q, %v; want nothing", k, b, err)
		}
	}
}

// TestWriteTooLong checks what happens to a write-back of a value longer
// than Redis' proto-max-bulk-len, which Redis refuses before running the
// script and then drops the connection: WriteRelease returns an error,
// after which Release on the same client drops the lease and wakes a
// Wait-er on another Remote; WriteReleaseMany releases such entries itself.
func TestWriteTooLong(t *testing.T) {
	t.Parallel()
	n := redistest.Server(t)
	c := n.Client()
	holder := newRemote(t, n.Client(), Options{})
	waiter := newRemote(t, n.Client(), Options{})
	registered := make(chan string, 1)
	waiter.onWait = func(key string) { registered <- key }
	ctx := t.Context()
	gs := acquireAll(t, holder, "big", "small1", "big2", "small2")
	if err := c.ConfigSet(ctx, "proto-max-bulk-len", "1mb").Err(); err != nil {
		t.Fatalf("CONFIG SET proto-max-bulk-len 1mb: %v", err)
	}
	big := fresh(strings.Repeat("x", 2<<20))

	done := waitFor(t, waiter, registered, "big")
	g := gs["big"]
	wrote, err := holder.WriteRelease(ctx, "big", big, g.Fence, time.Minute, g.Token)
	t.Logf("WriteRelease of a value over proto-max-bulk-len: %v, %v", wrote, err)
	if wrote || err == nil {
		t.Errorf("WriteRelease of a value over proto-max-bulk-len = %v, %v; want an error", wrote, err)
	}
	if !leaseHeld(t, c, holder, "big") {
		t.Fatal("the script of a refused command ran: the lease is gone")
	}
	if err := holder.Release(ctx, "big", g.Token); err != nil {
		t.Errorf("Release on the same client after the connection was dropped: %v", err)
	}
	woken(t, done, "Release")
	if leaseHeld(t, c, holder, "big") {
		t.Error("Release left the lease held")
	}

	done = waitFor(t, waiter, registered, "big2")
	var writes []remote.HeldWrite
	for _, k := range []string{"small1", "big2", "small2"} {
		env := fresh("v")
		if k == "big2" {
			env = big
		}
		writes = append(writes, remote.HeldWrite{HeldKey: remote.HeldKey{Key: k, Token: gs[k].Token}, Env: env, Fence: gs[k].Fence, TTL: time.Minute})
	}
	outs := holder.WriteReleaseMany(ctx, writes)
	for i, o := range outs {
		t.Logf("WriteReleaseMany with a value over proto-max-bulk-len: %q = %+v", writes[i].Key, o)
		if leaseHeld(t, c, holder, writes[i].Key) {
			t.Errorf("WriteReleaseMany left the lease of %q held", writes[i].Key)
		}
	}
	if outs[1].OK || outs[1].Err == nil {
		t.Errorf("WriteReleaseMany of a value over proto-max-bulk-len = %+v; want an error", outs[1])
	}
	woken(t, done, "WriteReleaseMany")
}
