package herd

import (
	"context"
	"fmt"
	"testing"
)

// A stripe knows which keys its recent bumps were for: a change of
// another key that shares the stripe does not count as a change of this
// one, a change of every key does, and so does one it no longer
// remembers.
func TestStripeChangedSince(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bumps []bump
		want  bool
	}{
		{"none", nil, false},
		{"another key", []bump{{key: "b"}, {key: "b"}}, false},
		{"the key", []bump{{key: "b"}, {key: "a"}}, true},
		{"every key", []bump{{all: true}}, true},
		{"as many as remembered", []bump{{key: "b"}, {key: "c"}, {key: "d"}, {key: "e"}, {key: "f"}, {key: "g"}, {key: "h"}, {key: "i"}}, false},
		{"more than remembered", []bump{{key: "b"}, {key: "c"}, {key: "d"}, {key: "e"}, {key: "f"}, {key: "g"}, {key: "h"}, {key: "i"}, {key: "j"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s genStripe
			s.bump("a", false) // before the read: never counts
			gen := s.n
			for _, b := range tc.bumps {
				s.bump(b.key, b.all)
			}
			if got := s.changedSince("a", gen); got != tc.want {
				t.Errorf("changedSince = %v, want %v", got, tc.want)
			}
		})
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
