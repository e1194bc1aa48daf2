package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/herdcache/herd/limiter"
)

func Example() {
	l, err := limiter.New(limiter.DefaultOptions(4))
	if err != nil {
		panic(err)
	}
	fmt.Println("limit:", l.Limit(), "reserve:", limiter.DefaultOptions(4).Reserve)

	// A foreground miss waits for a slot, up to QueueTimeout.
	ctx := limiter.WithPriority(context.Background(), limiter.High)
	if err := l.Acquire(ctx); err != nil {
		fmt.Println("shed:", err)
		return
	}
	// ... call the backing store ...
	l.Release()

	// Background refreshes never wait and leave the reserve to foreground calls.
	for i := range 4 {
		if !l.TryAcquireBackground() {
			fmt.Println("background refresh", i+1, "skipped: serve the cached value")
			continue
		}
		defer l.Release()
	}

	s := l.Stats()
	fmt.Println("acquired:", s.Acquired, "shed:", s.Shed(), "in use:", l.InUse())
	// Output:
	// limit: 4 reserve: 1
	// background refresh 4 skipped: serve the cached value
	// acquired: 4 shed: 1 in use: 3
}

func ExampleOverloadError() {
	l, err := limiter.New(limiter.Options{Limit: 1, QueueTimeout: time.Millisecond})
	if err != nil {
		panic(err)
	}
	if err := l.Acquire(context.Background()); err != nil {
		panic(err)
	}
	defer l.Release()

	// The only slot stays held, so this call waits QueueTimeout and is shed.
	err = l.Acquire(context.Background())
	err = fmt.Errorf("loading user 7: %w", err)
	var oe *limiter.OverloadError
	if errors.As(err, &oe) {
		fmt.Println(errors.Is(err, limiter.ErrOverloaded), oe.Reason, oe.Priority, oe.RetryAfter)
	}
	// Output:
	// true queue-timeout normal 1ms
}
