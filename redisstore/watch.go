package redisstore

// Watch registers for the next completion of key announced after it was
// called, as Wait waits for it, without blocking and without a Redis call
// ([herd.Watcher]): a loser registers before it asks for the lease, so that
// a completion announced between the answer and its wait still ends it.
// done is also closed when the subscription reconnects (announcements may
// have been lost) and when the Remote is closed.
func (r *Remote) Watch(key string) (done <-chan struct{}, stop func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed.Load() {
		return closedChan, func() {}
	}
	return r.waits.Watch(&r.mu, key)
}

// closedChan is the done of a watch on a closed Remote.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()
