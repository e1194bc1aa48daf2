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
