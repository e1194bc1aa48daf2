package flight_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/herdcache/herd/flight"
)

// Two callers ask for the same key at once; the load runs once and both
// get its value.
func ExampleGroup_Do() {
	joined := make(chan struct{})
	g := flight.Group[string, string]{
		// The second caller to arrive joins the first one's flight.
		OnJoin: func(key string) { close(joined) },
	}
	var loads atomic.Int32
	load := func(ctx context.Context) (string, error) {
		loads.Add(1)
		<-joined // hold the flight until the other caller has joined it
		return "profile of user 42", nil
	}

	var wg sync.WaitGroup
	results := make([]string, 2)
	for i := range results {
		wg.Go(func() {
			v, err, shared := g.Do(context.Background(), "user:42", load)
			results[i] = fmt.Sprintf("%s, err=%v, shared=%v", v, err, shared)
		})
	}
	wg.Wait()
	fmt.Println(results[0])
	fmt.Println(results[1])
	fmt.Println("loads:", loads.Load())
	// Output:
	// profile of user 42, err=<nil>, shared=true
	// profile of user 42, err=<nil>, shared=true
	// loads: 1
}

// A batch load: another caller is loading user:2 already, so DoMany joins
// that flight and queries the other keys in one go; a key fn leaves
// unsettled gets ErrUnsettled.
func ExampleGroup_DoMany() {
	started := make(chan struct{})
	joined := make(chan struct{})
	g := flight.Group[string, string]{
		OnStart: func(key string) {
			if key == "user:2" {
				close(started)
			}
		},
		OnJoin: func(key string) { close(joined) },
	}
	go g.Do(context.Background(), "user:2", func(ctx context.Context) (string, error) {
		<-joined // hold the flight until DoMany has joined it
		return "Grace", nil
	})
	<-started

	names := map[string]string{"user:1": "Ada", "user:3": "Edsger"}
	keys := []string{"user:1", "user:2", "user:3", "user:4", "user:1"}
	results := g.DoMany(context.Background(), keys, func(ctx context.Context, led []string, settle func(string, string, error)) {
		fmt.Println("query", led) // one round trip for the keys nobody else loads
		for _, key := range led {
			if name, ok := names[key]; ok {
				settle(key, name, nil)
			}
		}
	})
	for i, r := range results {
		fmt.Printf("%s: %q, err=%v, shared=%v\n", keys[i], r.Val, r.Err, r.Shared)
	}
	// Output:
	// query [user:1 user:3 user:4]
	// user:1: "Ada", err=<nil>, shared=false
	// user:2: "Grace", err=<nil>, shared=true
	// user:3: "Edsger", err=<nil>, shared=false
	// user:4: "", err=flight: function returned without settling the key, shared=false
	// user:1: "Ada", err=<nil>, shared=false
}
