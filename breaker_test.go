package herd

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var changes []bool
		b := &breaker{threshold: 3, cooldown: time.Second, onChange: func(open bool) { changes = append(changes, open) }}
		ctx := context.Background()
		down := errors.New("down")

		for i := range 2 {
			if !b.allow() {
				t.Fatalf("closed breaker refused call %d", i)
			}
			b.record(ctx, down)
		}
		if b.open() {
			t.Fatal("opened before the threshold")
		}
		b.record(ctx, nil) // a success resets the count
		for range 2 {
			b.record(ctx, down)
		}
		if b.open() {
			t.Fatal("failures before a success counted towards the threshold")
		}
		b.record(ctx, down)
		if !b.open() || b.allow() {
			t.Fatal("breaker did not open after 3 consecutive failures")
		}

		time.Sleep(time.Second - time.Millisecond)
		if b.allow() {
			t.Fatal("probe allowed before the cool-down")
		}
		time.Sleep(time.Millisecond)
		if !b.allow() {
			t.Fatal("no probe after the cool-down")
		}
		if b.allow() {
			t.Fatal("a second probe while the first runs")
		}
		b.record(ctx, down) // failed probe: open for another cool-down
		if b.allow() {
			t.Fatal("probe allowed right after a failed probe")
		}
		time.Sleep(time.Second)
		if !b.allow() {
			t.Fatal("no probe after the second cool-down")
		}
		b.record(ctx, nil)
		if b.open() || len(changes) != 2 || !changes[0] || changes[1] {
			t.Fatalf("open=%v changes=%v after a successful probe, want closed and [true false]", b.open(), changes)
		}
		d, opens := b.degraded()
		if d != 2*time.Second || opens != 1 {
			t.Fatalf("degraded %v over %d opens, want 2s over 1", d, opens)
		}
	})
}

func TestBreakerIgnoresCallerCancellation(t *testing.T) {
	b := &breaker{threshold: 1, cooldown: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.record(ctx, ctx.Err())
	if b.open() {
		t.Fatal("a caller's own cancellation opened the breaker")
	}
	b.record(context.Background(), errors.New("down"))
	if !b.open() {
		t.Fatal("threshold 1 did not open on a failure")
	}
}

func TestBreakerOff(t *testing.T) {
	b := &breaker{}
	for range 100 {
		b.record(context.Background(), errors.New("down"))
	}
	if b.open() || !b.allow() {
		t.Fatal("a zero threshold opened the breaker")
	}
}
