package storetest

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
)

// proofWait is how long testLiveNotifier waits for a proof of liveness
// after its changes; a tier that sends none (configured without them)
// passes, having shown that its changes reach SubscribeLive.
const proofWait = 3 * time.Second

// testLiveNotifier checks a [remote.LiveNotifier]: SubscribeLive hands fn
// the changes Subscribe does; a proof carries nothing but Live;
// a proof handed after a change's notice holds past the instant the change
// was asked for, since it was made after it; and Subscribe never hands out
// a proof.
func testLiveNotifier(t *testing.T, s remote.Store, _ remote.Lease) {
	n, ok := s.(remote.LiveNotifier)
	if !ok {
		t.Logf("%T does not implement remote.LiveNotifier: nothing to check", s)
		return
	}
	prefix := key(t, "")
	notices := make(chan remote.Notice, 1024)
	stop := n.SubscribeLive(func(x remote.Notice) {
		// Other subtests may share the remote: keep only this one's keys.
		if !x.Live.IsZero() || x.Fence == 0 || strings.HasPrefix(x.Key, prefix) {
			notices <- x
		}
	})
	defer stop()
	var plainProofs atomic.Int64
	stopPlain := n.Subscribe(func(x remote.Notice) {
		if !x.Live.IsZero() {
			plainProofs.Add(1)
		}
	})
	defer stopPlain()

	// A subscription may start listening a little after SubscribeLive
	// returns: touch a key until its notice arrives.
	first := key(t, "first")
	eventually(t, "first notice", func() bool {
		invalidate(t, s, first)
		for {
			select {
			case x := <-notices:
				if x.Key == first {
					return true
				}
			default:
				return false
			}
		}
	})
	keys := []string{key(t, "a"), key(t, "b"), key(t, "c")}
	var asked time.Time
	for _, k := range keys {
		asked = time.Now()
		invalidate(t, s, k)
	}

	// Expect each change (a Cluster's notices from different masters
	// come in no fixed order), proofs anywhere between them.
	var got []string
	proofs, after := 0, 0
	end := time.After(deadline)
	wait := func(proofAfterLast bool) bool {
		select {
		case x := <-notices:
			if !x.Live.IsZero() {
				if x.Key != "" || x.Fence != 0 || x.Dropped || x.Tag != "" {
					t.Fatalf("a proof of liveness carries a change: %+v", x)
				}
				proofs++
				if len(got) == len(keys) {
					if !x.Live.After(asked) {
						t.Fatalf("a proof handed after the last change's notice holds until %v, before the change was asked for at %v", x.Live, asked)
					}
					after++
				}
				return true
			}
			if x.Fence != 0 && slices.Contains(keys, x.Key) && !slices.Contains(got, x.Key) {
				got = append(got, x.Key)
			}
			return true
		case <-end:
			if proofAfterLast {
				return false
			}
			t.Fatalf("changes %q: notices %q within %v", keys, got, deadline)
		}
		return false
	}
	for len(got) < len(keys) {
		wait(false)
	}
	end = time.After(proofWait)
	for after == 0 && wait(true) {
	}
	t.Logf("%T: %d proofs of liveness, %d after the last change", s, proofs, after)
	if p := plainProofs.Load(); p != 0 {
		t.Fatalf("Subscribe handed out %d proofs of liveness, want none", p)
	}
}
