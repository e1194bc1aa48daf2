package herdhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/herdcache/herd"
)

// Purger is what [PurgeHandler] purges: a [Handler] or a [Transport].
type Purger interface {
	PurgeTag(ctx context.Context, tag string) error
	PurgeURL(ctx context.Context, rawURL string, keyFields http.Header) error
}

// PurgeTag retires every stored response whose Surrogate-Key or Cache-Tag
// field holds tag, on every replica, through herd's InvalidateTag: with a
// Store, in one call to it (one Redis command with redisstore), whatever
// the number of responses or replicas. Tags match whole and exactly: a
// purge of "/items" leaves "/items/1" stored. A fetch running meanwhile
// answers its requests but stores nothing. When the Store cannot be
// reached, this replica's tagged copies are dropped and the error wraps
// herd.ErrDegraded: the other replicas keep theirs.
func (h *Handler) PurgeTag(ctx context.Context, tag string) error { return h.e.purgeTag(ctx, tag) }

// PurgeURL retires, on every replica, what is stored for a GET of rawURL
// (an absolute http or https URL, as clients request it: with the
// host they name) carrying keyFields, whose values of Options.KeyHeaders
// are part of the key (nil for none): the response or Vary index under
// its key and every variant of it. A URL whose responses differ by a key
// field is purged once per value; a tag reaches them all at once. When
// the Store cannot be reached, this replica's copies are dropped and the
// error wraps herd.ErrDegraded.
func (h *Handler) PurgeURL(ctx context.Context, rawURL string, keyFields http.Header) error {
	return h.e.purgeURL(ctx, rawURL, keyFields)
}

// PurgeTag is [Handler.PurgeTag] for a Transport's cache.
func (t *Transport) PurgeTag(ctx context.Context, tag string) error { return t.e.purgeTag(ctx, tag) }

// PurgeURL is [Handler.PurgeURL] for a Transport's cache.
func (t *Transport) PurgeURL(ctx context.Context, rawURL string, keyFields http.Header) error {
	return t.e.purgeURL(ctx, rawURL, keyFields)
}

// errBadPurge is the error of a purge whose argument is invalid.
var errBadPurge = errors.New("herdhttp: invalid purge")

func (c *engine) purgeTag(ctx context.Context, tag string) error {
	if tag == "" || strings.ContainsAny(tag, " ,\t") {
		return fmt.Errorf("%w: tag %q: a tag is a non-empty word without spaces or commas", errBadPurge, tag)
	}
	if err := c.hc.InvalidateTag(ctx, tag); err != nil {
		return fmt.Errorf("herdhttp: purge tag %q: %w", tag, err)
	}
	return nil
}

func (c *engine) purgeURL(ctx context.Context, rawURL string, keyFields http.Header) error {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: %q is no absolute http or https URL", errBadPurge, rawURL)
	}
	if keyFields == nil {
		keyFields = http.Header{}
	}
	g := &http.Request{
		Method: http.MethodGet, Host: u.Host, Header: keyFields,
		URL: &url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery, ForceQuery: u.ForceQuery},
	}
	primary := c.primaryKey(g)
	// Every key is invalidated, whatever fails: a degraded replica drops
	// its own copies of each. The first error says why.
	err = c.hc.Invalidate(ctx, primary)
	for i := range c.o.MaxVariants {
		if verr := c.hc.Invalidate(ctx, herd.Key("vary", primary, strconv.Itoa(i))); err == nil {
			err = verr
		}
	}
	if err != nil {
		return fmt.Errorf("herdhttp: purge %s: %w", rawURL, err)
	}
	return nil
}
