package memory

import (
	"context"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/notify"
)

var _ remote.Tagger = (*Remote)(nil)

// TagKeep is how long a Remote keeps the version of a tag that nobody
// reads or invalidates.
const TagKeep = 24 * time.Hour

// tagVersion is one tag's version and when the Remote may drop it.
type tagVersion struct {
	v     uint64
	until time.Time
}

// InvalidateTag advances tag's version to max(the last + 1, time.Now in
// Unix microseconds) and notifies subscribers.
func (r *Remote) InvalidateTag(ctx context.Context, tag string) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "invalidate-tag", tag); err != nil {
		return 0, err
	}
	now := time.Now()
	v := max(r.tagVersion(tag, now)+1, uint64(max(now.UnixMicro(), 0)))
	r.tags[tag] = tagVersion{v: v, until: now.Add(TagKeep)}
	r.stats.TagInvalidates++
	for s := range r.subs {
		s.Push(notify.Notice{Tag: tag, Fence: v})
	}
	return v, nil
}

// TagVersions returns each tag's version; a tag without one gets
// time.Now less TagKeep, in Unix microseconds. Each tag read is kept for
// TagKeep more.
func (r *Remote) TagVersions(ctx context.Context, tags []string) ([]uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(ctx, "tag-versions", ""); err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]uint64, len(tags))
	for i, tag := range tags {
		out[i] = r.tagVersion(tag, now)
	}
	r.stats.TagReads += uint64(len(tags))
	return out, nil
}

// tagVersion returns tag's version at now, giving it one when it has none,
// and keeps it for TagKeep more. r.mu is held.
func (r *Remote) tagVersion(tag string, now time.Time) uint64 {
	if r.tags == nil {
		r.tags = make(map[string]tagVersion)
	}
	if len(r.tags) >= max(2*r.tagsSwept, minSweep) {
		// Drop the versions nobody used for TagKeep, as Redis expires them.
		for t, tv := range r.tags {
			if !now.Before(tv.until) {
				delete(r.tags, t)
			}
		}
		r.tagsSwept = len(r.tags)
	}
	tv, ok := r.tags[tag]
	if !ok || !now.Before(tv.until) {
		tv.v = max(tv.v, uint64(max(now.Add(-TagKeep).UnixMicro(), 0)))
	}
	tv.until = now.Add(TagKeep)
	r.tags[tag] = tv
	return tv.v
}
