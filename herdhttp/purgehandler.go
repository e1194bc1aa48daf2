package herdhttp

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/herdcache/herd"
)

// PurgeHandler returns the purge endpoints of p, for an admin listener
// (never the public one: a client that can purge can empty the cache):
//
//   - POST /purge/tag/{tag} purges a tag (escaped as a path segment is:
//     /purge/tag/%2Fitems purges "/items");
//   - POST /purge/url?url=URL purges an absolute URL, with the values of
//     the KeyHeaders that the purge request itself carries.
//
// Each needs "Authorization: Bearer " followed by token: without one the
// answer is 401, with another token 403. An empty token refuses every
// request (403). A purge answers 200 once done on every replica's Store,
// 400 for an invalid tag or URL, 405 for a method other than POST, 503
// when the Store cannot be reached (this replica's copies are dropped;
// retry), 500 otherwise.
func PurgeHandler(p Purger, token string) http.Handler {
	mux := http.NewServeMux()
	ph := &purgeHandler{p: p, token: []byte(token)}
	mux.HandleFunc("/purge/tag/{tag...}", ph.tag)
	mux.HandleFunc("/purge/url", ph.url)
	return mux
}

type purgeHandler struct {
	p     Purger
	token []byte
}

// allowed checks r's method and token and answers when they do not do.
func (ph *purgeHandler) allowed(w http.ResponseWriter, r *http.Request) bool {
	auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case !ok || auth == "":
		w.Header().Set("WWW-Authenticate", `Bearer realm="herd purge"`)
		http.Error(w, "purge needs Authorization: Bearer TOKEN", http.StatusUnauthorized)
		return false
	case len(ph.token) == 0 || subtle.ConstantTimeCompare([]byte(auth), ph.token) != 1:
		http.Error(w, "wrong purge token", http.StatusForbidden)
		return false
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "purge with POST", http.StatusMethodNotAllowed)
		return false
	}
	return true
}

func (ph *purgeHandler) tag(w http.ResponseWriter, r *http.Request) {
	if ph.allowed(w, r) {
		tag := r.PathValue("tag")
		ph.done(w, ph.p.PurgeTag(r.Context(), tag), "tag "+tag)
	}
}

func (ph *purgeHandler) url(w http.ResponseWriter, r *http.Request) {
	if ph.allowed(w, r) {
		u := r.URL.Query().Get("url")
		ph.done(w, ph.p.PurgeURL(r.Context(), u, r.Header), "url "+u)
	}
}

// done answers a purge of what that ended in err.
func (ph *purgeHandler) done(w http.ResponseWriter, err error, what string) {
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "purged %s\n", what)
	case errors.Is(err, errBadPurge):
		http.Error(w, err.Error(), http.StatusBadRequest)
	case errors.Is(err, herd.ErrDegraded):
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
