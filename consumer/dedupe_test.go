package consumer

import (
	"errors"
	"hash/maphash"
	"slices"
	"testing"

	"github.com/idem-dev/idem/broker"
)

// dedupe groups a batch by key whatever the hashes: with every key on one
// hash (as two keys colliding would be) the result is the same as with a
// real hash.
func TestDedupeGroupsByKey(t *testing.T) {
	seed := maphash.MakeSeed()
	for name, hash := range map[string]func([]byte) uint64{
		"maphash": func(k []byte) uint64 { return maphash.Bytes(seed, k) },
		"collide": func([]byte) uint64 { return 7 },
	} {
		t.Run(name, func(t *testing.T) {
			d := func(id, key, fp string) *delivery {
				return &delivery{m: &broker.Message{ID: id}, key: []byte(key), fp: []byte(fp)}
			}
			a1, b1, a2, c1, b2, a3, c2 := d("a1", "a", "x"), d("b1", "b", "x"), d("a2", "a", "x"), d("c1", "c", "x"), d("b2", "b", "y"), d("a3", "a", "x"), d("c2", "c", "x")
			none := &delivery{m: &broker.Message{ID: "none"}, keyErr: errors.New("no key")}
			claims, later, noKey := dedupe([]*delivery{a1, b1, a2, none, c1, b2, a3, c2}, hash)
			if !slices.Equal(claims, []*delivery{a1, b1, c1}) {
				t.Errorf("claims %v", ids(claims))
			}
			if !slices.Equal(later, []*delivery{b2}) {
				t.Errorf("later %v (a copy with another fingerprint)", ids(later))
			}
			if !slices.Equal(noKey, []*delivery{none}) {
				t.Errorf("no key %v", ids(noKey))
			}
			if !slices.Equal(a1.followers, []*delivery{a2, a3}) || !slices.Equal(c1.followers, []*delivery{c2}) || len(b1.followers) != 0 {
				t.Errorf("followers a %v, b %v, c %v", ids(a1.followers), ids(b1.followers), ids(c1.followers))
			}
		})
	}
}

func ids(ds []*delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.m.ID
	}
	return out
}
