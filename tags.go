package herd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
)

// Tags gives, from inside a load, the entry that load is making the tags
// it is retired with: [Cache.InvalidateTag] of any of them retires it, on
// every replica. Inside a batch load it tags every key of the call
// ([TagsFor] tags one). Outside a load it does nothing. An entry carries
// at most 1024 tags of at most 4096 bytes each; a load that gives more, or
// longer ones, is served but not cached. A reader of a tagged value from
// the Store reads its tags' versions too, one more round trip for a whole
// batch. A value stored with Set or SetWithTTL carries no tags, and with a
// Store that keeps no tag versions (no [remote.Tagger]) tags are ignored. Tag values
// only once every replica runs a herd that knows tags:
// an older one takes a tagged value for a corrupt one, and reloads it.
func Tags(ctx context.Context, tags ...string) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		ds.update("", true, func(d *directives) { d.tags = append(d.tags, tags...) })
	}
}

// TagsFor is Tags for one key of a batch load ([BatchLoadFunc]); it adds to
// the tags a Tags of the same load gives. Outside a batch load it does
// nothing.
func TagsFor(ctx context.Context, key string, tags ...string) {
	if ds, ok := ctx.Value(batchDirectivesKey{}).(*batchDirectives); ok {
		ds.update(key, false, func(d *directives) { d.tags = append(d.tags, tags...) })
	}
}

// InvalidateTag retires every entry tagged with tag ([Tags]), in both
// tiers, on every replica, whatever their number: with a Store, in one
// call of its [remote.Tagger] (one Redis command), which advances the tag's
// version; entries whose load began before it are refused by every reader,
// and a load running now is served to its callers but cached nowhere.
// Other replicas learn the version from the Store's notice, or, when the
// notice is lost, within 2×NearTTL, when their copies are read again. A
// Store that is no Tagger gives an error wrapping [errors.ErrUnsupported]
// (its values carry no tags); when the Store cannot be reached, the local
// entries with the tag are dropped and the error wraps [ErrDegraded].
func (c *Cache[V]) InvalidateTag(ctx context.Context, tag string) error {
	if c.closed.Load() {
		return ErrClosed
	}
	s := c.cfg.Store
	if s == nil {
		c.tags.bump(tag, uint64(max(c.clk.now()/1000, 0)))
		return nil
	}
	tg, ok := s.(remote.Tagger)
	if !ok {
		return fmt.Errorf("herd: InvalidateTag: the Store (%T) keeps no tag versions: %w", s, errors.ErrUnsupported)
	}
	var v uint64
	err := c.remoteChange(ctx, "invalidate-tag", tag, func() (err error) {
		v, err = tg.InvalidateTag(ctx, tag)
		return err
	})
	if err != nil {
		c.dropTagged(tag)
		return err
	}
	c.tags.learn(tag, v)
	return nil
}

// dropTagged drops every local entry tagged with tag.
func (c *Cache[V]) dropTagged(tag string) {
	for key, e := range c.local.All() {
		if slices.Contains(e.tags, tag) {
			c.unpublish(key, e)
		}
	}
}

// tagVersions is what a replica knows of its tags' versions. It forgets
// them all when it holds more than limit: an entry with a tag whose
// version it does not know is read again from the Store, which tells it.
type tagVersions struct {
	mu    sync.RWMutex
	m     map[string]uint64
	limit int
}

// learn records that tag's version is at least v.
func (t *tagVersions) learn(tag string, v uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.set(tag, max(t.m[tag], v))
}

// bump advances tag's version to max(the last + 1, now), for a cache
// without a Store.
func (t *tagVersions) bump(tag string, now uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.set(tag, max(t.m[tag]+1, now))
}

// set sets tag's version to v, forgetting every other first when the map
// is full. t.mu is held.
func (t *tagVersions) set(tag string, v uint64) {
	if t.m == nil || len(t.m) >= t.limit {
		t.m = make(map[string]uint64)
	}
	t.m[tag] = v
}

// current reports whether an entry with tags whose load began at since is
// still current: every tag's version is known and before since.
func (t *tagVersions) current(tags []string, since uint64) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, tag := range tags {
		if v, ok := t.m[tag]; !ok || v >= since {
			return false
		}
	}
	return true
}

// usable reports whether a local entry may be served: it is untagged, or
// every version of its tags is known and before its load began.
func (c *Cache[V]) usable(e *entry[V]) bool {
	return e.tags == nil || c.tags.current(e.tags, e.since)
}

// fetchTags reads from the Store the versions of the tags of the envelopes
// envs (each may be nil), in one call, and learns them. Without a Tagger,
// while the breaker is open, or when the call fails, nothing is learnt, so
// that no tagged entry is served from the Store.
func (c *Cache[V]) fetchTags(ctx context.Context, envs ...[]byte) {
	c.learnTags(ctx, appendTags(nil, envs...))
}

// appendTags appends to tags the tags that the envelopes envs carry.
func appendTags(tags []string, envs ...[]byte) []string {
	for _, env := range envs {
		if env == nil || len(env) <= envelope.FlagsOffset || envelope.Flags(env[envelope.FlagsOffset])&envelope.FlagTagged == 0 {
			continue
		}
		if ev, err := envelope.Decode(env); err == nil {
			tags = append(tags, ev.Tags...)
		}
	}
	return tags
}

// learnTags reads the versions of tags from the Store, in one call, and
// learns them; with no Store they are known already. While the breaker is
// open it makes no call (a due probe may be this one) and learns nothing:
// a load whose tags' versions are unknown is served but not cached.
func (c *Cache[V]) learnTags(ctx context.Context, tags []string) {
	if len(tags) == 0 || c.cfg.Store == nil {
		return
	}
	tg, ok := c.cfg.Store.(remote.Tagger)
	if !ok {
		return
	}
	if !c.brk.allow() {
		return
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	at := c.brk.at()
	vs, err := tg.TagVersions(ctx, tags)
	c.remoteDone(ctx, at, err)
	if err != nil || len(vs) != len(tags) {
		return
	}
	for i, tag := range tags {
		c.tags.learn(tag, vs[i])
	}
}

// tagged gives e, an entry a load is making, the tags d holds and the
// time its load began (since); it reports false when e must not be cached:
// one of its tags has a version at or after since (invalidated while it
// loaded), or is unknown, or the tags are too many or too long for the
// envelope.
func (c *Cache[V]) tagged(e *entry[V], d directives, since uint64) bool {
	if len(d.tags) == 0 {
		return true
	}
	if _, ok := c.cfg.Store.(remote.Tagger); c.cfg.Store != nil && !ok {
		return true // a Store that keeps no tag versions: tags are ignored
	}
	tags := slices.Clone(d.tags)
	slices.Sort(tags)
	tags = slices.Compact(tags)
	if len(tags) > envelope.MaxTags || slices.ContainsFunc(tags, func(t string) bool { return len(t) > envelope.MaxTagLen }) {
		return false
	}
	e.tags, e.since = tags, since
	if c.cfg.Store == nil {
		// Versions come from this process's clock: a tag never invalidated
		// has version 0, and retires nothing.
		for _, t := range tags {
			c.tags.learn(t, 0)
		}
	}
	return c.tags.current(tags, since)
}
