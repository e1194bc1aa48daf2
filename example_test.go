package herd_test

import (
	"context"
	"fmt"
	"time"

	"github.com/herdcache/herd"
	"github.com/herdcache/herd/limiter"
)

type Profile struct {
	ID   string
	Name string
}

// fetchProfile stands in for a database query.
func fetchProfile(ctx context.Context, tenant, id string) (Profile, error) {
	return Profile{ID: id, Name: "Ada"}, nil
}

func Example() {
	// One limiter for every cache in front of the same database.
	db, err := limiter.New(limiter.Options{Limit: 16, Reserve: 4, QueueTimeout: time.Second})
	if err != nil {
		panic(err)
	}
	profiles, err := herd.New(&herd.Options[Profile]{
		MaxEntries: 10_000,
		SoftTTL:    30 * time.Second, // fresh for 30 s,
		HardTTL:    5 * time.Minute,  // then served stale while one refresh runs
		Jitter:     0.1,
		Beta:       1,
		Limiter:    db,
	})
	if err != nil {
		panic(err)
	}
	defer profiles.Close(context.Background())

	ctx := context.Background()
	tenant, id := "acme", "42"
	// The key holds every input of the query, the tenant included.
	key := herd.Key("profile", tenant, id)
	p, err := profiles.Get(ctx, key, func(ctx context.Context) (Profile, error) {
		return fetchProfile(ctx, tenant, id)
	})
	fmt.Println(p.Name, err)
	fmt.Println(profiles.Stats().Loads, "load")
	// Output:
	// Ada <nil>
	// 1 load
}
