package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/herdcache/herd/remote"
)

// testTagger checks [remote.Tagger]: a tag never invalidated reads as a
// version in the past that stays put, InvalidateTag gives versions that
// grow and lie between the fences taken before and after it (a cache
// compares a value's lease fence with its tags' versions), TagVersions
// reads them back in order, and subscribers are told.
func testTagger(t *testing.T, s remote.Store, l remote.Lease) {
	tg := s.(remote.Tagger)
	ctx := t.Context()
	tag, other := key(t, "tag"), key(t, "other")
	vs, err := tg.TagVersions(ctx, []string{tag, other})
	if err != nil || len(vs) != 2 {
		t.Fatalf("TagVersions = %v, %v; want two versions", vs, err)
	}
	if now := uint64(time.Now().UnixMicro()); vs[0] >= now || vs[1] >= now {
		t.Errorf("versions of tags never invalidated = %v, want times before now (%d)", vs, now)
	}
	if again, err := tg.TagVersions(ctx, []string{tag}); err != nil || again[0] != vs[0] {
		t.Errorf("TagVersions again = %v, %v; want %d: a version stays put", again, err, vs[0])
	}

	var notices <-chan remote.Notice
	if n, ok := s.(remote.Notifier); ok {
		var stop func()
		notices, stop = listen(t, s, n, func(n remote.Notice) bool { return n.Tag == tag })
		defer stop()
	}

	before := lease(t, l, key(t, "before"), longTTL)
	v1, err := tg.InvalidateTag(ctx, tag)
	if err != nil {
		t.Fatalf("InvalidateTag: %v", err)
	}
	after := lease(t, l, key(t, "after"), longTTL)
	if v1 <= vs[0] || v1 <= before.Fence || v1 >= after.Fence {
		t.Errorf("InvalidateTag gave version %d; want it above %d (the last) and between the fences %d and %d taken before and after it", v1, vs[0], before.Fence, after.Fence)
	}
	v2, err := tg.InvalidateTag(ctx, tag)
	if err != nil || v2 <= v1 {
		t.Errorf("a second InvalidateTag = %d, %v; want a version above %d", v2, err, v1)
	}
	got, err := tg.TagVersions(ctx, []string{other, tag})
	if err != nil || got[0] != vs[1] || got[1] != v2 {
		t.Errorf("TagVersions after = %v, %v; want [%d %d]", got, err, vs[1], v2)
	}
	if notices != nil {
		timeout := time.After(deadline)
		for _, want := range []uint64{v1, v2} {
			select {
			case n := <-notices:
				if n.Tag != tag || n.Fence != want || n.Key != "" || n.Dropped {
					t.Errorf("notice = %+v, want {Tag %q, Fence %d}", n, tag, want)
				}
			case <-timeout:
				t.Fatalf("no notice of InvalidateTag (version %d)", want)
			}
		}
	}

	many := make([]string, 100)
	for i := range many {
		many[i] = key(t, fmt.Sprint("many", i))
	}
	if _, err := tg.InvalidateTag(ctx, many[42]); err != nil {
		t.Fatal(err)
	}
	mv, err := tg.TagVersions(ctx, many)
	if err != nil || len(mv) != len(many) {
		t.Fatalf("TagVersions of 100 tags = %d versions, %v", len(mv), err)
	}
	for i, v := range mv {
		if (i == 42) != (v > after.Fence) {
			t.Errorf("version %d of 100 = %d: only the one invalidated is recent", i, v)
		}
	}
}
