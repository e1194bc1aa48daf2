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

func ExampleCache_GetMany() {
	profiles := herd.Must(herd.New(&herd.Options[Profile]{MaxEntries: 1000, SoftTTL: time.Minute}))
	defer profiles.Close(context.Background())

	ctx := context.Background()
	keys := []string{"1", "2", "3"}
	// The loader stands in for one query of many rows: it is given only the
	// keys this replica must load, and leaves out the ones it did not find.
	load := func(ctx context.Context, keys []string) (map[string]Profile, error) {
		fmt.Println("query", keys)
		found := map[string]Profile{}
		for _, id := range keys {
			if id != "3" {
				found[id] = Profile{ID: id, Name: "user " + id}
			}
		}
		return found, nil
	}
	for i, it := range profiles.GetMany(ctx, keys, load) {
		fmt.Println(keys[i], it.Value.Name, it.Err)
	}
	// "1" and "2" are cached now: only "3" and "4" are queried.
	for _, it := range profiles.GetMany(ctx, []string{"1", "3", "4"}, load) {
		fmt.Println(it.Value.Name, it.Err)
	}
	// Output:
	// query [1 2 3]
	// 1 user 1 <nil>
	// 2 user 2 <nil>
	// 3  herd: not found
	// query [3 4]
	// user 1 <nil>
	//  herd: not found
	// user 4 <nil>
}
