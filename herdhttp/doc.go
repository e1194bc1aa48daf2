// Package herdhttp is a shared HTTP cache (RFC 9111) over a herd cache, as
// net/http middleware, a client Transport and a reverse proxy.
package herdhttp
