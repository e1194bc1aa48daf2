package remote_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/storetest"
)

// mapTier is the smallest remote tier that keeps the contracts of
// remote.Store and remote.Lease: one map under one mutex, as a store
// written outside this repository would be, from public packages only.
// A real backend keeps the same state per key (the envelope and its hard
// expiry, the fence, the lease's token and expiry) in its own rows or keys
// and changes it in one atomic step (a transaction, a script, a CAS).
type mapTier struct {
	mu     sync.Mutex
	keys   map[string]*mapKey // guarded by mu
	tokens uint64             // guarded by mu; the last lease token issued
}

// mapKey is one key's state; every field is guarded by mapTier.mu.
type mapKey struct {
	env      []byte    // nil when no value is stored
	expires  time.Time // the hard expiry given by the last write's ttl
	fence    uint64    // only grows, outlives the value and the lease
	token    string    // the lease holder's token, empty when none
	leaseEnd time.Time
	done     chan struct{} // closed by the key's next completion
}

func newMapTier() *mapTier { return &mapTier{keys: map[string]*mapKey{}} }

var (
	_ remote.Store = (*mapTier)(nil)
	_ remote.Lease = (*mapTier)(nil)
)

// key returns key's state, making it; the caller holds m.mu.
func (m *mapTier) key(key string) *mapKey {
	k, ok := m.keys[key]
	if !ok {
		k = &mapKey{done: make(chan struct{})}
		m.keys[key] = k
	}
	return k
}

// value returns the envelope stored under k, nil when none or past its
// hard expiry; the caller holds m.mu.
func (k *mapKey) value(now time.Time) []byte {
	if k.env == nil || !now.Before(k.expires) {
		return nil
	}
	return k.env
}

// check rejects, as the contract asks, a ttl that is not positive and an
// envelope that does not decode.
func check(env []byte, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("maptier: ttl %v: %w", ttl, remote.ErrRejected)
	}
	if _, err := envelope.Decode(env); err != nil {
		return fmt.Errorf("maptier: %w: %w", remote.ErrRejected, err)
	}
	return nil
}

// store keeps a copy of env, its fence field set to fence, for ttl.
func (k *mapKey) store(env []byte, fence uint64, ttl time.Duration) error {
	b := bytes.Clone(env)
	if err := envelope.SetFence(b, fence); err != nil {
		return fmt.Errorf("maptier: %w: %w", remote.ErrRejected, err)
	}
	k.env, k.expires = b, time.Now().Add(ttl)
	return nil
}

func (m *mapTier) Load(_ context.Context, key string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.key(key).value(time.Now())), nil
}

func (m *mapTier) Write(_ context.Context, key string, env []byte, fence uint64, ttl time.Duration) (bool, error) {
	if err := check(env, ttl); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(key)
	if fence != k.fence {
		return false, nil
	}
	return true, k.store(env, fence, ttl)
}

func (m *mapTier) Set(_ context.Context, key string, env []byte, ttl time.Duration) (uint64, error) {
	if err := check(env, ttl); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(key)
	if err := k.store(env, k.fence+1, ttl); err != nil {
		return 0, err
	}
	k.fence++
	return k.fence, nil
}

func (m *mapTier) Invalidate(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(key)
	k.fence++
	k.env = nil
	return nil
}

func (m *mapTier) Acquire(_ context.Context, key string, ttl time.Duration, after time.Time) (remote.Grant, error) {
	if ttl <= 0 {
		return remote.Grant{}, fmt.Errorf("maptier: lease ttl %v: %w", ttl, remote.ErrRejected)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	k := m.key(key)
	if v := k.value(now); v != nil {
		if e, err := envelope.Decode(v); err == nil && e.Soft > max(now.UnixMilli(), after.UnixMilli()) {
			return remote.Grant{Value: bytes.Clone(v)}, nil
		}
	}
	if k.token != "" && now.Before(k.leaseEnd) {
		return remote.Grant{HeldFor: k.leaseEnd.Sub(now)}, nil
	}
	m.tokens++
	k.fence++
	k.token, k.leaseEnd = strconv.FormatUint(m.tokens, 10), now.Add(ttl)
	return remote.Grant{Token: k.token, Fence: k.fence}, nil
}

func (m *mapTier) Extend(_ context.Context, key, token string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		return false, fmt.Errorf("maptier: lease ttl %v: %w", ttl, remote.ErrRejected)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	k := m.key(key)
	if token == "" || token != k.token || !now.Before(k.leaseEnd) {
		return false, nil
	}
	k.leaseEnd = now.Add(ttl)
	return true, nil
}

func (m *mapTier) Release(_ context.Context, key, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := m.key(key)
	if token != "" && token == k.token {
		k.token = ""
	}
	close(k.done) // the completion is announced whoever releases
	k.done = make(chan struct{})
	return nil
}

func (m *mapTier) Wait(ctx context.Context, key string) error {
	m.mu.Lock()
	done := m.key(key).done
	m.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestMapTier holds the map tier to the conformance suite every remote
// tier passes.
func TestMapTier(t *testing.T) {
	storetest.Run(t, func(*testing.T) (remote.Store, remote.Lease) {
		m := newMapTier()
		return m, m
	})
}
