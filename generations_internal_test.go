package herd

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/herdcache/herd/memory"
)

// change is one change recorded in a stripe: of key, or of every key.
type change struct {
	key string
	all bool
}

// others returns n changes of n distinct keys other than "a".
func others(n int) []change {
	out := make([]change, n)
	for i := range out {
		out[i] = change{key: fmt.Sprint("o", i)}
	}
	return out
}

// A stripe knows which keys were changed since a read of it: a change of
// another key that shares the stripe does not count as a change of this
// one, however often it comes; a change of every key does, and so does a
// change it no longer remembers.
func TestStripeChangedSince(t *testing.T) {
	repeated := make([]change, 5*lastKeys)
	for i := range repeated {
		repeated[i] = change{key: "b"}
	}
	for _, tc := range []struct {
		name    string
		changes []change
		want    bool
	}{
		{"none", nil, false},
		{"another key", []change{{key: "b"}, {key: "b"}}, false},
		{"another key, many times", repeated, false},
		{"the key", []change{{key: "b"}, {key: "a"}}, true},
		{"the key among many", append(others(lastKeys-1), change{key: "a"}), true},
		{"every key", []change{{all: true}}, true},
		{"every key, then others", append([]change{{all: true}}, others(3)...), true},
		{"as many keys as remembered", others(lastKeys), false},
		{"more keys than remembered", others(lastKeys + 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s genStripe
			s.bump("a", false) // before the read: never counts
			gen := s.n
			for _, c := range tc.changes {
				s.bump(c.key, c.all)
			}
			if got := s.changedSince("a", gen); got != tc.want {
				t.Errorf("changedSince = %v, want %v", got, tc.want)
			}
			if len(s.last) > lastKeys {
				t.Errorf("the stripe remembers %d keys, want at most %d", len(s.last), lastKeys)
			}
		})
	}
}

// Past lastKeys keys, a stripe forgets the key changed longest ago: a read
// made before that change then counts as changed for every key, one made
// after it does not, and the keys still remembered are told apart.
func TestStripeForgetsOlder(t *testing.T) {
	var s genStripe
	before := s.n
	s.bump("a", false)
	between := s.n
	for _, c := range others(lastKeys) {
		s.bump(c.key, false) // the last one pushes "a" out
	}
	if _, ok := s.last["a"]; ok {
		t.Fatalf("the stripe still remembers \"a\" after %d other keys changed", lastKeys)
	}
	if len(s.last) != lastKeys {
		t.Fatalf("the stripe remembers %d keys, want %d", len(s.last), lastKeys)
	}
	if !s.changedSince("a", before) {
		t.Error("a read before the forgotten change of \"a\" does not count as changed")
	}
	if !s.changedSince("z", before) {
		t.Error("a read before a forgotten change does not count as changed for another key")
	}
	if s.changedSince("z", between) {
		t.Error("a read after the forgotten change counts as changed for a key never changed")
	}
	if s.changedSince("a", between) {
		t.Error("a read after the change of \"a\" counts as changed, though no change of \"a\" came after it")
	}
	if !s.changedSince("o0", between) {
		t.Error("a remembered change after the read does not count")
	}
}

// An Invalidate of a key that shares a stripe with a key being loaded
// does not keep the load's value out of the local tier; an Invalidate of
// the loaded key itself does.
func TestUnrelatedInvalidateKeepsLoad(t *testing.T) {
	for _, same := range []bool{false, true} {
		t.Run(fmt.Sprintf("same key %v", same), func(t *testing.T) {
			c, err := New(&Options[int]{MaxEntries: 100, SoftTTL: 60e9})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			other := "a"
			if !same {
				other = sharingStripe(t, c, "a")
			}
			entered, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := c.Get(context.Background(), "a", func(context.Context) (int, error) {
					close(entered)
					<-release
					return 1, nil
				})
				done <- err
			}()
			<-entered
			if err := c.Invalidate(context.Background(), other); err != nil {
				t.Fatal(err)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if _, ok := c.GetIfPresent("a"); ok == same {
				t.Errorf("after an Invalidate of %q during the load of \"a\", the local tier holds \"a\": %v, want %v", other, ok, !same)
			}
		})
	}
}

// Sets of many other keys that share a stripe with a key being loaded,
// more than a stripe once remembered, keep neither tier from taking the
// load's value; a Set of the loaded key itself among them does, in both.
func TestUnrelatedSetsKeepLoad(t *testing.T) {
	const sets = 3 * lastKeys / 4 // two bumps each: more bumps than lastKeys
	for _, same := range []bool{false, true} {
		t.Run(fmt.Sprintf("same key %v", same), func(t *testing.T) {
			r := memory.New()
			c, err := New(&Options[int]{MaxEntries: 1000, SoftTTL: time.Minute, Store: r, Lease: r, LeaseTTL: time.Minute, NearTTL: time.Minute, NoBreaker: true})
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					_ = c.Close(context.Background())
				}
			}()
			keys := sharingStripes(t, c, "a", sets)
			if same {
				keys[len(keys)/2] = "a"
			}
			entered, release := make(chan struct{}), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := c.Get(context.Background(), "a", func(context.Context) (int, error) {
					close(entered)
					<-release
					return 1, nil
				})
				done <- err
			}()
			<-entered
			for _, k := range keys {
				if err := c.Set(context.Background(), k, 99); err != nil {
					t.Fatal(err)
				}
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			want := 1
			if same {
				want = 99
			}
			if v, ok := c.GetIfPresent("a"); !ok || v != want {
				t.Errorf("local tier holds \"a\" = %v (present %v), want %v", v, ok, want)
			}
			// Close waits for the load's write-back.
			if err := c.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			closed = true
			env, err := r.Load(context.Background(), "a")
			if err != nil {
				t.Fatal(err)
			}
			e, ok := c.decode("a", env, c.clk.now())
			if !ok || e.value != want {
				t.Errorf("the Store holds \"a\" = %v (decoded %v), want %v", e, ok, want)
			}
		})
	}
}

// sharingStripes returns n keys other than key in key's stripe of c.
func sharingStripes(t *testing.T, c *Cache[int], key string, n int) []string {
	var out []string
	for i := range 1 << 20 {
		k := fmt.Sprintf("k%d", i)
		if c.gens.stripe(k) == c.gens.stripe(key) {
			if out = append(out, k); len(out) == n {
				return out
			}
		}
	}
	t.Fatalf("%d keys share the stripe, want %d", len(out), n)
	return nil
}

// sharingStripe returns a key other than key in key's stripe of c.
func sharingStripe(t *testing.T, c *Cache[int], key string) string {
	for i := range 1 << 16 {
		k := fmt.Sprintf("k%d", i)
		if c.gens.stripe(k) == c.gens.stripe(key) {
			return k
		}
	}
	t.Fatal("no key shares the stripe")
	return ""
}
