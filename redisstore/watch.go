package redisstore

import "github.com/herdcache/herd/remote"

var (
	_ remote.BatchWatcher      = (*Remote)(nil)
	_ remote.CompletionCounter = (*Remote)(nil)
)

// Watch registers notify for the next completion of key announced after it
// was called, as Wait waits for it, without blocking and without a Redis
// call ([remote.Watcher]): a loser registers before it asks for the lease, so
// that a completion announced between the answer and its wait still ends
// it. notify is also called when the subscription reconnects
// (announcements may have been lost) and when the Remote is closed, or at
// once on a Remote closed already.
func (r *Remote) Watch(key string, notify func()) (stop func()) {
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		notify()
		return func() {}
	}
	defer r.mu.Unlock()
	return r.waits.Watch(&r.mu, key, notify)
}

// Completions returns a count that each later completion of key moves,
// and whatever else calls a Watch's notify ([remote.CompletionCounter]);
// keys share counts.
func (r *Remote) Completions(key string) uint64 { return r.waits.Count(key) }

// WatchMany is Watch for each of keys at once, under one lock and with
// the registrations allocated together ([remote.BatchWatcher]).
func (r *Remote) WatchMany(keys []string, notify func(i int)) (stop func(i int)) {
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		for i := range keys {
			notify(i)
		}
		return func(int) {}
	}
	defer r.mu.Unlock()
	return r.waits.WatchMany(&r.mu, keys, notify)
}
