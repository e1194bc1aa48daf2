// Package herdhttp is a shared HTTP cache (RFC 9111, with RFC 5861's
// stale-while-revalidate and stale-if-error) over a herd cache, whose
// misses and revalidations collapse to one origin request per key across
// every replica of a fleet.
//
// It comes in three forms, over one engine: [Middleware] in front of an
// http.Handler, [NewTransport] as an http.RoundTripper (for clients and
// for reverse proxies such as httputil.ReverseProxy), and [NewProxy], a
// caching reverse proxy to one upstream. Responses are kept in a herd
// cache: a local tier bounded in bytes (Options.MaxBytes), which keeps
// every response it answers as stored until newer ones evict it (bodies
// are stored up to a quarter of MaxBytes), and, with
// Options.Store, a tier shared by the replicas (redisstore in production,
// memory.Remote in one process). With Options.Lease, one replica fetches
// a key while the others wait for its notice.
//
// # The cache key
//
// A GET or HEAD is keyed by its scheme, host, path and query (as sent, or
// with Options.NormalizeQuery sorted by parameter name) and the values of
// Options.KeyHeaders, such as a tenant header. A response that varies
// (Vary) is stored under a secondary key made of the normalised values of
// the request fields it varies on (see below). The key must hold
// everything a response depends on: two requests that may be answered
// differently must never share a key, or one client is served another's
// response.
//
// # Which request fields reach the origin
//
// By default herdhttp sends the origin, on the fetches whose responses it
// may store, only the request fields that can be part of a key: Accept,
// Accept-Encoding, Accept-Language, Authorization, Cookie, the KeyHeaders,
// Options.ForwardHeaders and the fields the URL's responses vary on.
// Any other field a client sends is dropped from those fetches, so it
// cannot change a stored response (unkeyed-header poisoning). The cost:
// the origin never sees such a field (a trace or request id, a field a
// test harness counts requests by), and the first fetch of a URL whose
// response varies on a field not forwarded is made without it; a request
// that carries the field is then fetched again with it, and both
// responses are stored.
//
// With Options.ForwardAllFields, those fetches carry every end-to-end
// field of the client's request, as nginx, Varnish and most proxy caches
// send them (RFC 9110 §7.6): the origin sees what the client sent, and
// a response that varies is right the first time. The risk is the one
// the default closes: a field outside the key and the Vary that the
// origin reflects into a cacheable response (X-Forwarded-Host in a link,
// a debug field that changes the page) lets one client poison that
// response for every client until it expires. Use it in front of an
// origin whose cacheable responses depend on nothing else.
//
// In both modes a fetch never carries the client's conditionals or
// Range (it must bring a whole response), nor a hop-by-hop field; the
// requests passed to the origin uncached carry every end-to-end field.
//
// # What is stored, and for how long (RFC 9111)
//
//   - GET responses with a status that is final and understood (not 206
//     or 304) are stored when they give a freshness lifetime: s-maxage,
//     then max-age, then Expires less Date. An Expires that does not
//     follow the HTTP-date grammar to the character (a doubled space, a
//     one-digit hour, a zone other than GMT; only the case of names is
//     forgiven), or that is given more than once, is already expired
//     (§5.3). Age counts by the first member of its first line. Without one, a response with a status cacheable by default
//     (200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501) is fresh for
//     Options.Heuristic of its age since Last-Modified, at most
//     Options.HeuristicMax, and only when Heuristic is set.
//   - A response to a request with Authorization that carries none of
//     public, s-maxage or must-revalidate (§3.5) is not stored, and marks
//     nothing: the rule is about that request, not the URL. The requests
//     that waited for its fetch go to the origin; the next request is an
//     ordinary miss.
//   - Not stored, and the key marked hit-for-pass for Options.PassTTL (a
//     second for 5xx answers): no-store, unqualified private, Vary: *,
//     Set-Cookie (unless
//     Options.StoreSetCookie, which stores the response without it), a
//     status not stored, no freshness, a body over Options.MaxBodyBytes,
//     a header over Options.MaxHeaderBytes (header-too-large; stored
//     fields count against MaxBytes), and a response already stale on arrival that nothing lets be used.
//     no-store with must-understand is stored when the status is one of
//     RFC 9110's whose caching rules herdhttp follows; must-understand
//     with any other status is not stored (§5.2.2.3).
//     Requests to a key marked hit-for-pass go to the origin at once,
//     uncollapsed; on every replica the mark is what the waiting requests
//     get from the lease holder's notice.
//   - Stored fields are every field received but hop-by-hop fields (and
//     those Connection names), Set-Cookie, and the fields a qualified
//     private or no-cache names; the request that made the fetch is
//     answered with all of them. A response without Date gets the time it
//     was received.
//   - A targeted field of Options.TargetedFields (RFC 9213), such as
//     CDN-Cache-Control, which DefaultOptions obeys, replaces
//     Cache-Control and Expires for this cache when it parses as a
//     Structured Fields Dictionary; one that does not parse is ignored.
//     Clients get it as the origin sent it.
//   - Age is computed as §4.2.3 says, from the request and response times
//     stored in the entry and the Date and Age the origin sent. Those times
//     come from the clock of the replica that fetched; another replica
//     computes the age with its own clock, so the replicas' clocks must
//     agree to well within the freshness lifetimes used: a replica whose
//     clock is ahead by d serves a response d older than it is.
//   - Every answer carries Age and a Cache-Status member (RFC 9211) named
//     Options.Name: hit (with its ttl), fwd=uri-miss, vary-miss, stale,
//     request, method or bypass, with fwd-status, stored, collapsed and a
//     detail where they apply.
//   - no-cache (unqualified) makes every reuse wait for a validation;
//     must-revalidate and proxy-revalidate forbid serving the response
//     stale (stale windows included); when the origin cannot be reached
//     the answer is 504. The implied proxy-revalidate of s-maxage does not
//     override an explicit stale-while-revalidate or stale-if-error.
//   - The request's Cache-Control is honoured only with
//     Options.RequestCacheControl: no-store and no-cache send the request
//     to the origin (the latter storing the answer), max-age, min-fresh
//     and max-stale bound what is served, only-if-cached answers 504
//     rather than fetch; Pragma: no-cache counts as no-cache when there is
//     no Cache-Control.
//   - Vary: each URL whose responses vary has an index (the field names)
//     under its key and its responses under up to Options.MaxVariants
//     secondary keys, chosen by a hash of the normalised values: field
//     lines joined, list members trimmed, Accept-Encoding reduced to its
//     set of codings with a non-zero q, the other Accept fields
//     lower-cased. A stored response is served only to a request whose
//     normalised values equal its own; values that share a secondary key
//     replace each other.
//   - A HEAD is answered from a stored GET; a HEAD that nothing stored
//     answers is passed to the origin.
//   - A stale response with an ETag or Last-Modified is revalidated with
//     If-None-Match or If-Modified-Since; a 304 replaces the stored fields
//     it carries (Content-Length aside) and the response's times. A
//     response with a validator is kept Options.KeepForRevalidation (an
//     hour in DefaultOptions) past its freshness and stale windows to be
//     revalidated so, within the byte bound of the local tier.
//   - An unsafe method (not GET, HEAD, OPTIONS or TRACE) answered with a
//     status below 400 invalidates its target URI and the URIs of its
//     Location and Content-Location on the same host (§4.4), variants
//     included, on every replica with a Store.
//   - A request that asks to switch protocols (Connection: Upgrade, such
//     as a WebSocket handshake) passes to the origin untouched: a
//     Handler's to the next handler or the upstream (whose 101 hands the
//     connection over, both ways), a Transport's to the RoundTripper it
//     wraps. Nothing about it is looked up or stored.
//   - A client's If-None-Match (weak comparison), or If-Modified-Since
//     when there is none (compared with the stored Last-Modified, or with
//     the stored Date when there is no Last-Modified), that a stored 200
//     meets is answered 304. A
//     single byte range (with If-Range, if any, holding) is served from a
//     stored 200 as 206 or 416; several ranges are answered with the whole
//     response; a Range that nothing stored answers is passed to the
//     origin and its answer not stored.
//   - Bodies are streamed to the request that fetched them and to the
//     requests of this process that join the fetch, as they arrive. A body
//     is stored only whole: one cut short reaches its readers as a failed
//     transfer and is stored nowhere. A body that passes
//     Options.MaxBodyBytes (at most MaxBytes/4), or announces it with
//     Content-Length, marks its
//     key hit-for-pass for the fleet at once; the requests already reading
//     it read it to the end.
//   - The informational (1xx) responses the origin sends before its
//     answer, such as 103 Early Hints, are forwarded to the client whose
//     request made the fetch (RFC 9110 §15.2), 100 Continue aside; they
//     are never stored, and other clients never get them.
//
// # Stale responses (RFC 5861)
//
// Within stale-while-revalidate past its freshness, a stale response is
// served at once and one revalidation runs behind it for the whole fleet
// (one per key at a time in a process, and one per fleet through the
// lease). Past that window, a
// request waits for a revalidation (collapsed as a miss is), and is served
// the stale response only when the origin answers 500, 502, 503 or 504,
// cannot be reached or the limiter sheds the fetch, within stale-if-error;
// after such a failure this replica serves the stale response without
// asking the origin for Options.ErrorBackoff. The two windows are kept
// apart: max-age=60, stale-while-revalidate=600, stale-if-error=86400
// serves and revalidates for ten minutes, then serves stale only on error
// for a day. The herd cache holds the entry until the end of the longest
// window; which window applies is decided from the times stored in the
// entry.
//
// A miss is one herd lookup: a Peek of both tiers, which waits for no
// fetch, then, when what it found does not answer the request, one Get
// whose Accept takes only what does (a response received after the
// request arrived, or one it may use fresh), and otherwise fetches under
// the lease. The herd cache holds an entry for all its windows, and at
// least a second, so that the requests that waited for its fetch on other
// replicas get it even when nothing may reuse it later (max-age=0,
// no-cache); which request it answers is decided by the request alone.
//
// # Collapsing
//
// Concurrent requests for a key that nothing fresh answers make one
// origin request: in a process they read the fetch's stream; across
// replicas, with a Lease, they wait for the holder's notice and read what
// it stored. Misses collapse on the URL, or on the secondary key the URL's
// Vary index gives; a waiter whose request does not match the Vary of the
// response it waited for goes to the origin at once. With
// Options.Limiter, a fetch the limiter sheds is answered 503 with
// Retry-After, unless stale-if-error lets a stale response be served.
//
// # Purge and tags
//
// An origin tags a response with a Surrogate-Key or Cache-Tag field, a
// list of tags separated by spaces or commas (Surrogate-Key: product-1
// /products). [Handler.PurgeTag] retires every stored response with a
// tag, variants included, on every replica: herd's InvalidateTag, one
// call to the Store (one Redis command), whatever the number of
// responses or replicas. Tags match whole: a purge of /items leaves
// /items/1 stored. [Handler.PurgeURL] retires the response stored for a
// URL and each of its variants, on every replica. A replica that is not
// the purging one learns of a purge from the Store's notice (or, when
// that is lost, within 2×NearTTL). When the Store cannot be reached, a
// purge drops this replica's copies and returns an error wrapping
// herd.ErrDegraded. A response carries at most 1024 tags of at most 4096
// bytes, or it is answered but not stored. The tag fields are stored and
// removed from every answer to a client, unless Options.ForwardTags is
// set.
//
// A tagged response reaches the shared tier only through a fetch of its
// own key: one fetched under another (the first response of a URL that
// varies, or a response fetched while another is held for its key) is
// answered but not stored there, and the next request for it fetches it
// again.
//
// [PurgeHandler] serves POST /purge/tag/{tag} and POST
// /purge/url?url=URL behind a bearer token, for an admin listener:
// a client that can purge can empty the cache, so the purge endpoints
// never share a listener with the public. A PURGE request on the public
// handler is passed to the origin like any method the cache does not
// know.
//
// # Serving hits without net/http's server
//
// A Handler serves under any net/http server. In front of one, Server
// answers the requests that are plain hits (a GET or HEAD over HTTP/1.1
// answered from memory) on each connection's own loop, field for field
// as ServeHTTP answers them under net/http, and hands a connection to
// the net/http server at its first request that is anything else; herd
// proxy serves so unless it writes an access log.
//
// # Metrics
//
// A Recorder that implements [RouteRecorder] gets each request's
// [Outcome] by route, one of Options.Routes (http.ServeMux patterns) or
// "other", and each revalidation sent to the origin; [Counts] keeps them
// in memory. One that implements [OriginRecorder] times each request to
// the origin by route, and Options.OnOriginError hears of each that
// failed without a response. herd's own Recorder events (loads, leases,
// shedding) reach Options.Recorder as for any herd cache, and a
// Handler's Name and Stats make it a herdprom.Source.
package herdhttp
