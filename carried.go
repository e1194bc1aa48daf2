package herd

import "github.com/herdcache/herd/remote"

// adopt replaces cur, the local copy of n.Key, with the envelope that the
// change notice n carries, and reports whether it did or found nothing left
// to replace; false means the notice is to be handled as a plain change.
// It adopts only a value that is newer than the copy held (by fence), that
// decodes, carries n's fence, is usable (its tags' versions known and
// current) and not past its hard expiry, and only while the key is held
// and no Set or Invalidate of it runs here: a replica never gains a key
// from a notice. A copy whose fence is not known yet (its write-back has
// not answered) is left to the read, as before. Stats counts what it
// replaced in NoticeValuesAdopted, and noticed the carried values it
// refused in NoticeValuesRefused.
func (c *Cache[V]) adopt(n remote.Notice, cur *entry[V]) bool {
	if n.Value == "" || cur.fence.Load() == 0 || c.closed.Load() {
		return false
	}
	now := c.clk.now()
	e, ok := c.decode(n.Key, []byte(n.Value), now)
	if !ok || e.fence.Load() != n.Fence || !c.usable(e) || now >= e.hard {
		return false
	}
	s := c.gens.stripe(n.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changes[n.Key] > 0 || c.gens.all.Load() > 0 {
		return false
	}
	held, ok := c.local.GetIfPresent(n.Key)
	switch {
	case !ok:
		return true // dropped meanwhile: nothing to replace, and no key to gain
	case held.fence.Load() >= n.Fence:
		return true // a copy as new came meanwhile
	case held != cur:
		return false
	}
	s.puts++
	e.born = c.clk.now()
	c.local.Set(n.Key, e)
	c.st.noticeValuesAdopted.add(1)
	return true
}
