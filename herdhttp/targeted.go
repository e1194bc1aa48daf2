package herdhttp

import (
	"net/http"
	"strconv"

	"github.com/dunglas/httpsfv"
)

// responseDirectives returns the cache directives of a response with
// fields h that this cache obeys (RFC 9213 §2.1): those of the first
// field of targeted that h carries and that parses as a Dictionary of
// Structured Fields, which replace Cache-Control and Expires (targeted
// true); otherwise its Cache-Control. An empty or malformed targeted
// field is ignored, as if absent.
func responseDirectives(h http.Header, targeted []string) (cc cacheControl, ok bool) {
	for _, name := range targeted {
		lines := h.Values(name)
		if len(lines) == 0 {
			continue
		}
		if cc := parseTargeted(lines); cc != nil {
			return cc, true
		}
	}
	return parseCacheControl(h), false
}

// deltaDirectives are the directives whose argument is delta-seconds:
// in a targeted field, an Integer.
var deltaDirectives = map[string]bool{"max-age": true, "s-maxage": true, "stale-while-revalidate": true, "stale-if-error": true}

// parseTargeted parses the lines of a targeted field into the directives
// they give; nil when they are empty or not a Dictionary. A directive
// with a value of the wrong type is left out (RFC 9213 §2.1): a
// delta-seconds one needs a non-negative Integer, the others true (no
// argument) or a String (a qualified no-cache or private). A directive
// that is false is absent.
func parseTargeted(lines []string) cacheControl {
	d, err := httpsfv.UnmarshalDictionary(lines)
	if err != nil || len(d.Names()) == 0 {
		return nil
	}
	cc := cacheControl{}
	for _, name := range d.Names() {
		m, _ := d.Get(name)
		item, ok := m.(httpsfv.Item)
		if !ok {
			continue // an inner list is no directive's argument
		}
		switch v := item.Value.(type) {
		case int64:
			if deltaDirectives[name] && v >= 0 {
				cc[name] = strconv.FormatInt(v, 10)
			}
		case bool:
			if v && !deltaDirectives[name] {
				cc[name] = ""
			}
		case string:
			if !deltaDirectives[name] {
				cc[name] = v
			}
		}
	}
	return cc
}
