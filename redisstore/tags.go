package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/herdcache/herd/remote"
)

var _ remote.Tagger = (*Remote)(nil)

// TagKeep is how long Redis keeps the version of a tag that nobody reads
// or invalidates.
const TagKeep = 24 * time.Hour

var (
	invalidateTagScript = script("invalidatetag")
	tagVersionScript    = script("tagversion")
)

// InvalidateTag advances tag's version, kept under
// <prefix>{<tag's hash>}:<tag>:t for TagKeep, to max(the last + 1, the
// server's clock in Unix microseconds), with one script, and announces it.
func (r *Remote) InvalidateTag(ctx context.Context, tag string) (uint64, error) {
	if err := r.check("invalidate-tag", tag); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout+r.ackTimeout)
	defer cancel()
	v, err := r.change(ctx, invalidateTagScript, []string{r.space.TagName(tag)}, r.channel, tag, TagKeep.Milliseconds()).Int64()
	if err != nil {
		return 0, r.fail("invalidate-tag", tag, err)
	}
	return uint64(v), nil
}

// TagVersions returns the version of each tag, with pipelines of one
// script per tag, bounded as "Batches" in the package doc says (one round
// trip per master that holds some of a pipeline's tags), keeping each for
// TagKeep more; a tag without one gets the server's clock less TagKeep.
func (r *Remote) TagVersions(ctx context.Context, tags []string) ([]uint64, error) {
	if err := r.check("tag-versions", ""); err != nil {
		return nil, err
	}
	runs := make([]scriptRun, len(tags))
	for i, tag := range tags {
		runs[i] = scriptRun{entry: i, script: tagVersionScript, keys: []string{r.space.TagName(tag)}, args: []any{TagKeep.Milliseconds()}, retry: true}
	}
	out := make([]uint64, len(tags))
	for i, cmd := range r.runMany(ctx, runs, false) {
		v, err := cmd.Int64()
		if err != nil {
			return nil, r.fail("tag-versions", tags[i], fmt.Errorf("tag %q: %w", tags[i], err))
		}
		out[i] = uint64(v)
	}
	return out, nil
}
