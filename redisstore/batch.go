package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd/remote"
	"github.com/herdcache/herd/remote/envelope"
	"github.com/herdcache/herd/remote/notify"
)

// The batch calls send pipelines of at most BatchKeys entries and
// BatchBytes bytes, one after another (spans), each of which go-redis
// splits by master on a Cluster (following MOVED and ASK), so a pipeline
// costs one round trip per server that holds some of its keys. Each entry
// is checked and answered as the single call would check and answer it; an
// entry that fails leaves the others alone.

var (
	_ remote.BatchStore = (*Remote)(nil)
	_ remote.BatchLease = (*Remote)(nil)
)

// The scripts of WriteReleaseMany, which announce nothing: it publishes one
// batch notice for the whole call once its pipeline has returned.
var (
	batchWriteReleaseScript = script("batchwriterelease")
	batchReleaseScript      = script("batchrelease")
)

// LoadMany returns the envelopes stored under keys, in order, with
// pipelines of GETs, each bounded as "Batches" in the package doc says; the
// GETs of a pipeline that timed out are sent once more, in a pipeline of
// their own. A key with none has a nil Value and no error. Like Load, it
// does not check the bytes.
func (r *Remote) LoadMany(ctx context.Context, keys []string) []remote.Loaded {
	out := make([]remote.Loaded, len(keys))
	gen, ok := r.batchGeneration(ctx, "load", len(keys), func(i int, err error) { out[i].Err = err })
	if !ok {
		return out
	}
	names := make([]string, 0, len(keys))
	which := make([]int, 0, len(keys)) // the entry of each name
	for i, key := range keys {
		if err := r.check("load", key); err != nil {
			out[i].Err = err
			continue
		}
		names = append(names, r.space.NamesAt(key, gen).Value)
		which = append(which, i)
	}
	r.spans(len(names), true, func(j int) int { return len(names[j]) + argBytes }, func(lo, hi int) {
		gets := make([]*redis.StringCmd, hi-lo)
		all := make([]int, hi-lo)
		for j := range all {
			all[j] = j
		}
		r.getAll(ctx, names[lo:hi], all, gets)
		var again []int // timed out: a read is safe to send once more
		for j, get := range gets {
			if timedOut(get.Err()) {
				again = append(again, j)
			}
		}
		if len(again) > 0 && ctx.Err() == nil {
			r.getAll(ctx, names[lo:hi], again, gets)
		}
		read, late := 0, false
		for j, get := range gets {
			i := which[lo+j]
			b, err := get.Bytes()
			switch {
			case errors.Is(err, redis.Nil):
			case err != nil:
				out[i].Err = r.fail("load", keys[i], err)
				late = late || timedOut(err)
			default:
				out[i].Value = b
				read += len(b)
			}
		}
		r.learn(hi-lo, read, late)
	})
	return out
}

// getAll GETs the names at the given indexes in one pipeline, within
// r.timeout, putting their commands at the same indexes of gets.
func (r *Remote) getAll(ctx context.Context, names []string, which []int, gets []*redis.StringCmd) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	p := r.client.Pipeline()
	for _, j := range which {
		gets[j] = p.Get(ctx, names[j])
	}
	_, _ = p.Exec(ctx) // each command holds its own outcome
}

// AcquireMany does what Acquire does for each request, in pipelines of
// the acquire script bounded as "Batches" in the package doc says, which
// also returns the stored value that was not fresh as the entry's Stale.
// An acquisition that timed out may have taken its lease: its entry gets
// the error, and the lease is released (and announced) with the release
// script.
func (r *Remote) AcquireMany(ctx context.Context, reqs []remote.LeaseRequest, ttl time.Duration) []remote.Acquired {
	out := make([]remote.Acquired, len(reqs))
	gen, ok := r.batchGeneration(ctx, "acquire", len(reqs), func(i int, err error) { out[i].Err = err })
	if !ok {
		return out
	}
	runs := make([]scriptRun, 0, len(reqs))
	tokens := make([]string, 0, len(reqs))
	for i, q := range reqs {
		if err := r.check("acquire", q.Key); err != nil {
			out[i].Err = err
			continue
		}
		ms, err := millis("acquire", q.Key, ttl)
		if err != nil {
			out[i].Err = err
			continue
		}
		token := newToken()
		n := r.space.NamesAt(q.Key, gen)
		runs = append(runs, scriptRun{entry: i, script: acquireScript,
			keys: []string{n.Value, n.Lease, n.Fence},
			args: []any{token, ms, max(q.After.UnixMilli(), 0), r.fenceTTL(ms), "1", r.noticeChannel(ctx, n.Value), r.id, q.Key}}) // "1": return the value that was not fresh
		tokens = append(tokens, token)
	}
	var lapsed []scriptRun // acquisitions that timed out, and may have taken their leases
	for j, cmd := range r.runMany(ctx, runs, true) {
		i := runs[j].entry
		key := reqs[i].Key
		res, err := cmd.Slice()
		if tryAgain(err) { // the key's slot is migrating
			ms, _ := millis("acquire", key, ttl) // valid: the run was sent
			out[i] = r.acquireOneSplit(ctx, gen, reqs[i], tokens[j], ms)
			continue
		}
		if err != nil {
			out[i].Err = r.fail("acquire", key, err)
			if timedOut(err) {
				lapsed = append(lapsed, releaseRun(i, runs[j].keys[1], tokens[j]))
			}
			continue
		}
		g, stale, ok := grant(res, tokens[j])
		if !ok {
			out[i].Err = fmt.Errorf("redisstore: acquire %q: unexpected reply %v", key, res)
			continue
		}
		out[i] = remote.Acquired{Grant: g, Stale: stale}
	}
	r.releaseLapsed(ctx, reqs, lapsed)
	return out
}

// acquireOneSplit does what Acquire does for q, in the one-key steps of
// acquireSplit, for a request of AcquireMany whose key's slot is
// migrating, within r.timeout. Its entry's Stale is nil.
func (r *Remote) acquireOneSplit(ctx context.Context, gen uint64, q remote.LeaseRequest, token string, ms int64) remote.Acquired {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	g, err := r.acquireSplit(ctx, r.space.NamesAt(q.Key, gen), q.Key, token, ms, max(q.After.UnixMilli(), 0))
	if err != nil {
		return remote.Acquired{Err: r.fail("acquire", q.Key, err)}
	}
	return remote.Acquired{Grant: g}
}

// releaseLapsed gives up the leases that the acquisitions of runs may have
// taken before they timed out, which no caller holds, and announces their
// completions, so that no lease is left held for its TTL; on ctx's values
// but not its end, each pipeline within r.timeout.
func (r *Remote) releaseLapsed(ctx context.Context, reqs []remote.LeaseRequest, runs []scriptRun) {
	if len(runs) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	r.spans(len(runs), false, func(j int) int { return runs[j].size() }, func(lo, hi int) {
		var ends []batchEnd
		for j, cmd := range r.runSpan(ctx, runs[lo:hi]) {
			if cmd.Err() == nil {
				ends = append(ends, batchEnd{key: reqs[runs[lo+j].entry].Key})
			}
		}
		r.announce(ctx, ends)
	})
}

// ExtendMany does what Extend does for each lease, in pipelines of the
// extend script bounded as "Batches" in the package doc says; a run that
// timed out is sent once more.
func (r *Remote) ExtendMany(ctx context.Context, leases []remote.HeldKey, ttl time.Duration) []remote.Outcome {
	out := make([]remote.Outcome, len(leases))
	gen, ok := r.batchGeneration(ctx, "extend", len(leases), func(i int, err error) { out[i].Err = err })
	if !ok {
		return out
	}
	runs := make([]scriptRun, 0, len(leases))
	for i, l := range leases {
		if err := r.check("extend", l.Key); err != nil {
			out[i].Err = err
			continue
		}
		ms, err := millis("extend", l.Key, ttl)
		if err != nil {
			out[i].Err = err
			continue
		}
		if l.Token == "" {
			continue // no lease holds the empty token
		}
		n := r.space.NamesAt(l.Key, gen)
		runs = append(runs, scriptRun{entry: i, script: extendScript,
			keys:  []string{n.Lease, n.Fence},
			args:  []any{l.Token, ms, r.fenceTTL(ms)},
			retry: true})
	}
	for j, cmd := range r.runMany(ctx, runs, false) {
		i := runs[j].entry
		if tryAgain(cmd.Err()) { // the key's slot is migrating: tried again, a bounded number of times
			rctx, cancel := context.WithTimeout(ctx, r.timeout)
			cmd = r.run(rctx, runs[j].script, runs[j].keys, runs[j].args...)
			cancel()
		}
		ok, err := cmd.Int64()
		if err != nil {
			out[i].Err = r.fail("extend", leases[i].Key, err)
			continue
		}
		out[i].OK = ok == 1
	}
	return out
}

// WriteReleaseMany does what WriteRelease does for each write, or Release
// when its Env is nil, with pipelines of scripts that announce nothing,
// bounded as "Batches" in the package doc says. After each pipeline it
// wakes this Remote's Wait-ers of every key whose script answered and
// announces those keys' changes (under their fences, for the keys it
// wrote) and completions, in batch notices of at most 256 keys each, sent
// in one pipeline of PUBLISHes.
//
// A write whose arguments WriteRelease would refuse (an Env that does not
// decode, a ttl that is not positive) is refused alone, and its lease is
// not released. A write that Redis refuses (OOM under maxmemory) still
// releases, as WriteRelease does, and its entry's Err wraps
// [ErrWriteFailed]. A script that timed out is sent once more (under the
// same fence and token, a second run changes nothing that the first did;
// if another replica's lease advanced the fence in between, the entry
// reports no write). An entry whose script still failed (a connection
// dropped, a timeout, an error reply) is released once more with the
// release script, and announced if that answers; its Err stays the
// script's. If a PUBLISH fails, its notices are lost, as notices can be;
// the outcomes stand.
func (r *Remote) WriteReleaseMany(ctx context.Context, writes []remote.HeldWrite) []remote.Outcome {
	out := make([]remote.Outcome, len(writes))
	gen, ok := r.batchGeneration(ctx, "write-release", len(writes), func(i int, err error) { out[i].Err = err })
	if !ok {
		return out
	}
	runs := make([]scriptRun, 0, len(writes))
	for i, w := range writes {
		n := r.space.NamesAt(w.Key, gen)
		if w.Env == nil || w.Fence > envelope.MaxFence { // no key's fence gets there
			if err := r.check("release", w.Key); err != nil {
				out[i].Err = err
				continue
			}
			runs = append(runs, releaseRun(i, n.Lease, w.Token))
			continue
		}
		ms, err := r.prepare("write-release", w.Key, w.Env, w.TTL)
		if err != nil {
			out[i].Err = err
			continue
		}
		runs = append(runs, scriptRun{entry: i, script: batchWriteReleaseScript,
			keys:  []string{n.Value, n.Fence, n.Lease},
			args:  []any{strconv.FormatUint(w.Fence, 10), ms, w.Env, w.Token, r.fenceTTL(ms)},
			retry: true}) // under the same fence and token, a second run changes nothing
	}
	r.spans(len(runs), false, func(j int) int { return runs[j].size() }, func(lo, hi int) {
		span := runs[lo:hi]
		ends := make([]batchEnd, 0, len(span))
		var again []scriptRun // the runs that failed, to be released once more
		for j, cmd := range r.runSpan(ctx, span) {
			i := span[j].entry
			key := writes[i].Key
			if span[j].script == batchReleaseScript {
				if err := cmd.Err(); err != nil {
					out[i].Err = r.fail("release", key, err)
					again = append(again, span[j])
					continue
				}
				ends = append(ends, batchEnd{key: key})
				continue
			}
			res, err := cmd.Slice()
			if tryAgain(err) { // the key's slot is migrating
				ms, _ := r.prepare("write-release", key, writes[i].Env, writes[i].TTL) // valid: the run was sent
				out[i] = r.writeReleaseOneSplit(ctx, gen, writes[i], ms)
				continue
			}
			if err != nil {
				out[i].Err = r.fail("write-release", key, err)
				again = append(again, releaseRun(i, span[j].keys[2], writes[i].Token))
				continue
			}
			wrote, fence, refused, ok := written(res)
			switch {
			case !ok || wrote && fence != writes[i].Fence:
				out[i].Err = fmt.Errorf("redisstore: write-release %q: unexpected reply %v", key, res)
				again = append(again, releaseRun(i, span[j].keys[2], writes[i].Token))
				continue
			case refused != "":
				out[i].Err = writeFailed(key, refused)
			}
			out[i].OK = wrote
			ends = append(ends, batchEnd{key: key, fence: fence})
		}
		if len(again) > 0 {
			for j, cmd := range r.runSpan(context.WithoutCancel(ctx), again) {
				if cmd.Err() == nil {
					ends = append(ends, batchEnd{key: writes[again[j].entry].Key})
				}
			}
		}
		r.announce(ctx, ends)
	})
	return out
}

// writeReleaseOneSplit does what WriteRelease does for w, in the one-key
// steps of writeReleaseSplit, which announce w's key themselves, for a
// write of WriteReleaseMany whose key's slot is migrating, within
// r.timeout; ms is w.TTL in milliseconds.
func (r *Remote) writeReleaseOneSplit(ctx context.Context, gen uint64, w remote.HeldWrite, ms int64) remote.Outcome {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	wrote, err := r.writeReleaseSplit(ctx, r.space.NamesAt(w.Key, gen), w.Key, w.Env, w.Fence, ms, w.Token)
	r.mu.Lock()
	r.wake(w.Key)
	r.mu.Unlock()
	if err != nil {
		return remote.Outcome{OK: wrote, Err: r.fail("write-release", w.Key, err)}
	}
	return remote.Outcome{OK: wrote}
}

// releaseRun is the run of the batch release script of entry i, whose
// lease key is lease.
func releaseRun(i int, lease, token string) scriptRun {
	return scriptRun{entry: i, script: batchReleaseScript, keys: []string{lease}, args: []any{token}, retry: true}
}

// announce wakes this Remote's Wait-ers of the keys of ends and publishes
// their batch notices in one pipeline, on ctx's values but not its end
// (the loads have ended: other replicas' Wait-ers are waiting for them),
// within r.timeout.
func (r *Remote) announce(ctx context.Context, ends []batchEnd) {
	if len(ends) == 0 {
		return
	}
	r.mu.Lock()
	for _, e := range ends {
		r.wake(e.key)
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
	defer cancel()
	// On a Cluster's shard channels, each on its own master, the notices
	// go out side by side, in order on each.
	var wg sync.WaitGroup
	for ch, ends := range r.byChannel(ctx, ends) {
		wg.Go(func() { r.publishAll(ctx, ch, formatBatchNotices(r.id, ends)) })
	}
	wg.Wait()
}

// publishAll publishes msgs on ch in order (see publish), in one pipeline
// on the classic channel; a notice that fails is lost, as notices can be.
func (r *Remote) publishAll(ctx context.Context, ch string, msgs []string) {
	if len(msgs) == 1 || isShardChannel(ch) {
		for _, m := range msgs {
			_ = r.publish(ctx, ch, m)
		}
		return
	}
	p := r.client.Pipeline()
	for _, m := range msgs {
		p.Publish(ctx, ch, m)
	}
	_, _ = p.Exec(ctx)
}

// byChannel groups ends by the channel their keys' notices go to
// (noticeChannel), in the order of ends within each.
func (r *Remote) byChannel(ctx context.Context, ends []batchEnd) map[string][]batchEnd {
	if r.shardChannels == nil {
		return map[string][]batchEnd{r.channel: ends}
	}
	groups := make(map[string][]batchEnd)
	for _, e := range ends {
		ch := r.noticeChannel(ctx, r.space.Names(e.key).Value)
		groups[ch] = append(groups[ch], e)
	}
	return groups
}

// ErrWriteFailed is wrapped by the error of a write-back that Redis
// refused while running its script (OOM under maxmemory with
// maxmemory-policy noeviction): nothing was stored, but the lease was
// released and the completion announced.
var ErrWriteFailed = errors.New("redisstore: Redis refused the write")

// writeFailed is the error of key's write that Redis refused with msg.
func writeFailed(key, msg string) error {
	return fmt.Errorf("redisstore: write-release %q: %w: %s (the lease was released)", key, ErrWriteFailed, msg)
}

// written reads the batch write-release script's reply: whether it wrote
// and, if it did, the fence it wrote under (0 when it did not); or, when
// Redis refused the write, its error message as refused.
func written(res []any) (wrote bool, fence uint64, refused string, ok bool) {
	if len(res) != 2 {
		return false, 0, "", false
	}
	n, isInt := res[0].(int64)
	cur, isString := res[1].(string)
	switch {
	case !isInt || !isString:
		return false, 0, "", false
	case n == 0:
		return false, 0, "", true
	case n == 2:
		return false, 0, cmp.Or(cur, "write failed"), true
	case n != 1:
		return false, 0, "", false
	}
	f, err := strconv.ParseUint(cur, 10, 64)
	if err != nil || f > envelope.MaxFence {
		return false, 0, "", false
	}
	return true, f, "", true
}

// scriptRun is one run of a script in a batch, answering one entry of the
// batch call.
type scriptRun struct {
	entry  int // the index of the entry in the call's arguments and result
	script *redis.Script
	keys   []string
	args   []any
	// retry is set for a run that is safe to send again after it timed
	// out, whether or not it ran: all but acquisitions, which take a new
	// lease under their token.
	retry bool
}

// argBytes is what one argument of a command costs beside its bytes, in
// the request (its length header) and in the reply, as counted against
// BatchBytes.
const argBytes = 16

// size returns about how many bytes run takes in a request.
func (run scriptRun) size() int {
	n := 2*argBytes + len(run.script.Hash())
	for _, k := range run.keys {
		n += argBytes + len(k)
	}
	for _, a := range run.args {
		n += argBytes
		switch a := a.(type) {
		case string:
			n += len(a)
		case []byte:
			n += len(a)
		default:
			n += 20 // a number
		}
	}
	return n
}

// runMany runs every run with EVALSHA, in pipelines split by spans (reads
// when the replies carry values), each within r.timeout, and returns their
// commands in order.
func (r *Remote) runMany(ctx context.Context, runs []scriptRun, reads bool) []*redis.Cmd {
	cmds := make([]*redis.Cmd, 0, len(runs))
	r.spans(len(runs), reads, func(j int) int { return runs[j].size() }, func(lo, hi int) {
		span := r.runSpan(ctx, runs[lo:hi])
		if reads {
			n, late := 0, false
			for _, cmd := range span {
				n += replyBytes(cmd.Val())
				late = late || timedOut(cmd.Err())
			}
			r.learn(hi-lo, n, late)
		}
		cmds = append(cmds, span...)
	})
	return cmds
}

// runSpan runs every run with EVALSHA in one pipeline, within r.timeout,
// and returns their commands in order; the retryable runs that timed out
// are sent once more, in a pipeline of their own, unless ctx has ended.
func (r *Remote) runSpan(ctx context.Context, runs []scriptRun) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(runs))
	if len(runs) == 0 {
		return cmds
	}
	all := make([]int, len(runs))
	for i := range all {
		all[i] = i
	}
	r.runRound(ctx, runs, all, cmds)
	var again []int
	for i, cmd := range cmds {
		if runs[i].retry && timedOut(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 && ctx.Err() == nil {
		r.runRound(ctx, runs, again, cmds)
	}
	return cmds
}

// runRound runs the runs at the given indexes with EVALSHA in one
// pipeline, within r.timeout, putting their commands at the same indexes
// of cmds. The runs that fail with NOSCRIPT (a server restarted, failed
// over or flushed its scripts) are run once more, in a second pipeline,
// after their scripts are loaded on every master; if the loading fails,
// they fail with its error.
func (r *Remote) runRound(ctx context.Context, runs []scriptRun, which []int, cmds []*redis.Cmd) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	r.evalSha(ctx, runs, which, cmds)

	var again []int
	var missing []*redis.Script
	for _, i := range which {
		if redis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			again = append(again, i)
			if !slices.Contains(missing, runs[i].script) {
				missing = append(missing, runs[i].script)
			}
		}
	}
	if len(again) == 0 {
		return
	}
	if err := r.loadScripts(ctx, missing); err != nil {
		for _, i := range again {
			cmds[i].SetErr(fmt.Errorf("%w (loading the script: %w)", cmds[i].Err(), err))
		}
		return
	}
	r.evalSha(ctx, runs, again, cmds)
}

// evalSha runs the runs at the given indexes with EVALSHA in one pipeline,
// putting their commands at the same indexes of cmds.
func (r *Remote) evalSha(ctx context.Context, runs []scriptRun, which []int, cmds []*redis.Cmd) {
	p := r.client.Pipeline()
	for _, i := range which {
		cmds[i] = runs[i].script.EvalSha(ctx, p, runs[i].keys, runs[i].args...)
	}
	_, _ = p.Exec(ctx) // each command holds its own outcome
}

// spans calls send with consecutive spans [lo, hi) of n entries, in order,
// each of at most r.batchKeys entries and r.batchBytes bytes, an entry
// larger than that alone; size(i) is entry i's bytes in the request. For
// reads, each entry also counts, for its reply, the mean length of the
// values that the last pipeline of reads returned (r.valueBytes).
func (r *Remote) spans(n int, reads bool, size func(i int) int, send func(lo, hi int)) {
	for lo := 0; lo < n; {
		var value int
		if reads {
			value = int(r.valueBytes.Load())
		}
		hi, bytes := lo, 0
		for hi < n && hi-lo < r.batchKeys {
			b := size(hi) + value
			if hi > lo && bytes+b > r.batchBytes {
				break
			}
			bytes += b
			hi++
		}
		send(lo, hi)
		lo = hi
	}
}

// learn records that a pipeline of reads of n keys returned bytes bytes of
// values: the next pipeline counts their mean for each key, or half the
// last mean if that is more, so that a pipeline of keys that held little
// does not make the next one, whose keys may hold more, much longer. A
// pipeline that timed out (late) doubles the mean instead, up to
// r.batchBytes: the next one carries half as many keys.
func (r *Remote) learn(n, bytes int, late bool) {
	last := int(r.valueBytes.Load())
	switch {
	case late:
		r.valueBytes.Store(int64(min(2*last, r.batchBytes)))
	case n > 0:
		r.valueBytes.Store(int64(max(bytes/n, last/2, 1)))
	}
}

// timedOut reports whether err is a deadline that passed.
func timedOut(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// replyBytes returns about how many bytes the reply v took.
func replyBytes(v any) int {
	switch v := v.(type) {
	case string:
		return len(v)
	case []any:
		n := 0
		for _, e := range v {
			n += replyBytes(e)
		}
		return n
	}
	return 0
}

// loadScripts loads scripts where EVALSHA will look for them: on every
// master of a Cluster, at once, or on the one server of any other client.
func (r *Remote) loadScripts(ctx context.Context, scripts []*redis.Script) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, s := range scripts {
			if err := s.Load(ctx, c).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if c, ok := r.client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return load(ctx, node)
		})
	}
	return load(ctx, r.client)
}

// A batch notice announces some of the loads that one WriteReleaseMany
// ended, as one message: 'b', the announcing Remote's id (originLen bytes), then one
// record per key, in the call's order:
//
//	w<fence>:<length>:<key>   key written under fence, then its load completed
//	d<length>:<key>           key's load completed without a write
//
// where <length> is the key's length in bytes, so a key may hold any bytes,
// and decimals are canonical: digits only, no leading zero, a fence in
// [1, 2^53). A message with no record, or any record malformed, is ignored
// whole. A message holds at most noticeRecords records and, unless it has
// only one, noticeBytes bytes: a batch is announced in as many as it takes,
// so that each stays one bounded item of a subscriber's queue.
const (
	writtenRecord = 'w'
	doneRecord    = 'd'

	noticeRecords = 256
	noticeBytes   = 32 << 10
)

// formatBatchNotices formats the batch notices of ends, announced by
// origin: ends in order, split as few times as the bounds of a message
// allow.
func formatBatchNotices(origin string, ends []batchEnd) []string {
	var msgs []string
	for lo := 0; lo < len(ends); {
		hi, n := lo, 1+len(origin)
		for hi < len(ends) && hi-lo < noticeRecords {
			b := recordBytes(ends[hi])
			if hi > lo && n+b > noticeBytes {
				break
			}
			n += b
			hi++
		}
		msgs = append(msgs, formatBatchNotice(origin, ends[lo:hi]))
		lo = hi
	}
	return msgs
}

// recordBytes returns the length of e's record in a batch notice.
func recordBytes(e batchEnd) int {
	n := 1 + digits(uint64(len(e.key))) + 1 + len(e.key)
	if e.fence > 0 {
		n += digits(e.fence) + 1
	}
	return n
}

// digits returns the number of decimal digits of n.
func digits(n uint64) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// batchEnd is one record of a batch notice: key's load ended, writing its
// value under fence, or nothing when fence is 0.
type batchEnd struct {
	key   string
	fence uint64
}

// formatBatchNotice formats the batch notice of ends, announced by origin.
func formatBatchNotice(origin string, ends []batchEnd) string {
	n := 1 + len(origin)
	for _, e := range ends {
		n += 3 + 2*20 + len(e.key) // kind, two colons, two decimals of up to 20 digits
	}
	b := make([]byte, 0, n)
	b = append(b, batchNotice)
	b = append(b, origin...)
	for _, e := range ends {
		if e.fence > 0 {
			b = append(b, writtenRecord)
			b = strconv.AppendUint(b, e.fence, 10)
			b = append(b, ':')
		} else {
			b = append(b, doneRecord)
		}
		b = strconv.AppendUint(b, uint64(len(e.key)), 10)
		b = append(b, ':')
		b = append(b, e.key...)
	}
	return string(b)
}

// parseBatchNotice parses a batch notice as formatBatchNotice formats it:
// its origin and records. It reports false if any part is malformed.
func parseBatchNotice(p string) (origin string, ends []batchEnd, ok bool) {
	if len(p) <= 1+originLen || p[0] != batchNotice {
		return "", nil, false
	}
	origin, p = p[1:1+originLen], p[1+originLen:]
	for p != "" {
		var e batchEnd
		kind := p[0]
		p = p[1:]
		switch kind {
		case writtenRecord:
			f, rest, ok := decimal(p)
			if !ok || f == 0 || f > envelope.MaxFence { // a write is under a fence past 0
				return "", nil, false
			}
			e.fence, p = f, rest
		case doneRecord:
		default:
			return "", nil, false
		}
		n, rest, ok := decimal(p)
		if !ok || n > uint64(len(rest)) {
			return "", nil, false
		}
		e.key, p = rest[:n], rest[n:]
		ends = append(ends, e)
	}
	return origin, ends, true
}

// decimal reads the canonical decimal that starts p and ends at a ':', and
// returns it and the rest of p after the ':'.
func decimal(p string) (n uint64, rest string, ok bool) {
	i := 0
	for i < len(p) && '0' <= p[i] && p[i] <= '9' {
		i++
	}
	if i == 0 || i == len(p) || p[i] != ':' || p[0] == '0' && i > 1 {
		return 0, "", false
	}
	n, err := strconv.ParseUint(p[:i], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return n, p[i+1:], true
}

// dispatchBatch handles a batch notice: subscribers get one Notice per key
// written, all of them one message of their queues, and each key's
// Wait-ers wake, unless this Remote announced it (WriteReleaseMany woke
// them). A malformed notice is ignored whole.
func (r *Remote) dispatchBatch(payload string) {
	origin, ends, ok := parseBatchNotice(payload)
	if !ok {
		return
	}
	var ns []notify.Notice // shared by the subscriptions, changed by none
	for _, e := range ends {
		if e.fence > 0 {
			ns = append(ns, notify.Notice{Key: e.key, Fence: e.fence})
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for s := range r.subs {
		s.PushAll(ns)
	}
	if origin != r.id {
		for _, e := range ends {
			r.wake(e.key)
		}
	}
}

// batchGeneration is generation for a batch of n entries: when it cannot
// be read, each entry is given the error by fail, and ok is false. An
// empty batch reads nothing.
func (r *Remote) batchGeneration(ctx context.Context, op string, n int, fail func(int, error)) (gen uint64, ok bool) {
	if n == 0 {
		return 0, false
	}
	gen, err := r.generation(ctx, op, "")
	if err != nil {
		for i := range n {
			fail(i, err)
		}
		return 0, false
	}
	return gen, true
}
