package redisstore_test

import (
	"context"

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
