// Package redisfleet holds the tests of many herd replicas over one real
// Redis: one load per expiry fleet-wide, lease takeover, fencing and
// degradation when Redis dies.
package redisfleet
