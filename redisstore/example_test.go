package redisstore_test

import (
	"context"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/redisstore"
)

type Profile struct{ Name string }

// Redis as the tier shared by replicas: one load per key per fleet.
func Example() {
	client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	remote, err := redisstore.New(redisstore.Options{Client: client})
	if err != nil {
		panic(err)
	}
	defer remote.Close()

	o := herd.DefaultOptions[Profile]()
	o.Store, o.Lease = remote, remote // near-cache 1 s, 5 s lease with a watchdog
	o.OnLeaseHeld = herd.ServeStale   // losers serve stale, or wait for the push
	profiles, err := herd.New(o)
	if err != nil {
		panic(err)
	}
	defer profiles.Close(context.Background())

	p, err := profiles.Get(context.Background(), herd.Key("profile", "acme", "42"),
		func(ctx context.Context) (Profile, error) { return Profile{Name: "Ada"}, nil })
	_, _ = p, err
}

// A readiness check: Ping before the replica takes traffic. A cache made
// over a Remote that has not reached Redis starts degraded: its first Get
// probes Redis, the others serve from memory meanwhile.
func ExampleRemote_Ping() {
	ctx := context.Background()
	client := redisstore.NewClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	remote, err := redisstore.New(redisstore.Options{Client: client})
	if err != nil {
		panic(err)
	}
	defer remote.Close()
	if err := remote.Ping(ctx); err != nil {
		log.Printf("starting degraded: %v", err) // or fail the readiness probe
	}

	o := herd.DefaultOptions[Profile]()
	o.Store, o.Lease = remote, remote
	profiles, err := herd.New(o)
	if err != nil {
		panic(err)
	}
	defer profiles.Close(ctx)
}
