package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/keyspace"
	"github.com/herdcache/herd/remote/notify"
)

var _ remote.Clearer = (*Remote)(nil)

// InvalidateAll retires every key at once, with one script on one key
// whatever the number of keys: it advances the keyspace's generation, kept
// under <prefix>{gen}, to max(the last + 1, the server's clock in Unix
// microseconds), and announces it. Every name of a key carries the
// generation it was made in, so what was stored before is no longer read,
// and expires at its own TTL; a lease or fence taken before is no lease
// or fence of the new generation, so no write under it is accepted. The
// generation key has no TTL: under an allkeys-* maxmemory-policy Redis
// may evict it, and a Remote that reads no generation then reads the names
// of generation 0 again, so use a volatile-* policy (or noeviction) with
// InvalidateAll.
func (r *Remote) InvalidateAll(ctx context.Context) error {
	if err := r.check("invalidate-all", ""); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+r.ackTimeout)
	defer cancel()
	g, err := r.change(ctx, invalidateAllScript, []string{r.space.Generation()}, r.channel).Int64()
	if err != nil {
		return r.fail("invalidate-all", "", err)
	}
	r.learnGeneration(uint64(g))
	return nil
}

// names returns key's Redis names in the current generation, read from
// Redis first when this Remote does not know it (before the first read,
// and after the subscription reconnects, when a change of it may have been
// missed).
func (r *Remote) names(ctx context.Context, op, key string) (keyspace.Names, error) {
	gen, err := r.generation(ctx, op, key)
	if err != nil {
		return keyspace.Names{}, err
	}
	return r.space.NamesAt(key, gen), nil
}

// generation returns the current generation of the keyspace, as names
// does; op and key name the call it is read for.
func (r *Remote) generation(ctx context.Context, op, key string) (uint64, error) {
	if r.genKnown.Load() {
		return r.gen.Load(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	s, err := r.client.Get(ctx, r.space.Generation()).Result()
	var g uint64
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return 0, r.fail(op, key, fmt.Errorf("reading the generation: %w", err))
	default:
		if g, err = strconv.ParseUint(s, 10, 64); err != nil {
			return 0, fmt.Errorf("redisstore: %s %q: the generation key %q holds %q, not a generation: %w", op, key, r.space.Generation(), s, remote.ErrRejected)
		}
	}
	r.learnGeneration(g)
	return r.gen.Load(), nil
}

// learnGeneration records that the keyspace is at generation g: a
// generation only grows, so an older one changes nothing.
func (r *Remote) learnGeneration(g uint64) {
	for {
		cur := r.gen.Load()
		if cur >= g || r.gen.CompareAndSwap(cur, g) {
			break
		}
	}
	r.genKnown.Store(true)
}

// cleared handles the announcement of an InvalidateAll that took the
// keyspace to generation g: subscribers drop everything, and Wait-ers
// wake, to find their keys' leases free in the new generation. r.mu is
// held.
func (r *Remote) cleared(g uint64) {
	r.learnGeneration(g)
	for s := range r.subs {
		s.Push(notify.Notice{Dropped: true})
	}
	r.waits.WakeAll()
}
