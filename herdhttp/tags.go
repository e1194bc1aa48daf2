package herdhttp

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"
)

// tagFields are the response fields an origin tags its responses with:
// Surrogate-Key, as Fastly and Varnish's xkey name it, and Cache-Tag, as
// Cloudflare and others do. Their values are lists of tags separated by
// spaces or commas.
var tagFields = []string{"Surrogate-Key", "Cache-Tag"}

// responseTags returns the tags that the fields h of a response give:
// the members of every Surrogate-Key and Cache-Tag line, split on spaces
// and commas, sorted and without duplicates; nil when there are none.
// Tags are compared whole: "/items" and "/items/1" are two tags.
func responseTags(h http.Header) []string {
	var tags []string
	for _, f := range tagFields {
		for _, line := range h.Values(f) {
			tags = append(tags, strings.FieldsFunc(line, func(r rune) bool {
				return r == ' ' || r == ',' || r == '\t'
			})...)
		}
	}
	if len(tags) == 0 {
		return nil
	}
	slices.Sort(tags)
	return slices.Compact(tags)
}

// tagged reports whether e is a response that carries tags.
func (e *entry) tagged() bool {
	return e.kind == kindResponse && responseTags(e.header) != nil
}

// setUntagged stores e under key for soft and hard outside a load, unless
// e carries tags, and reports whether it stored it. herd tags only what a
// load returns (herd.Tags): a tagged response set outside one would carry
// no tags, and outlive a purge of them. Such a response is answered but
// not stored; the next request for key fetches it through a load.
func (c *engine) setUntagged(ctx context.Context, key string, e *entry, soft, hard time.Duration) bool {
	if e.tagged() {
		return false
	}
	return c.hc.SetWithTTL(ctx, key, e, soft, hard) == nil
}

// serve answers r as roundTrip does, without the tag fields unless
// Options.ForwardTags is set: tags name the origin's internals (its
// tables, its users' ids) and are the cache's business alone.
func (c *engine) serve(r *http.Request, in *interim, p peeked) (*http.Response, error) {
	resp, err := c.roundTrip(r, in, p)
	if err != nil || c.o.ForwardTags {
		return resp, err
	}
	// Every answer's top-level header map is its own (respond copies the
	// stored fields into a new one): deleting from it changes no entry.
	for _, f := range tagFields {
		delete(resp.Header, f)
	}
	return resp, nil
}
