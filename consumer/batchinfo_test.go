package consumer

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/memstore"
)

// MessageToken finds each message's token whatever order the handler asks
// in (in order, reversed, twice, a message not in the batch).
func TestBatchInfoTokenAnyOrder(t *testing.T) {
	st, _ := memstore.New(memstore.Config{SweepInterval: -1})
	defer st.Close()
	g, _ := idem.NewGuard(st, idem.WithHeartbeat(-1))
	defer g.Close()
	const n = 5
	b := &batchInfo{}
	want := map[*broker.Message]uint64{}
	for i := range n {
		key := []byte(fmt.Sprint("k", i))
		h, _, err := g.Acquire(context.Background(), key)
		if err != nil || h == nil {
			t.Fatalf("acquire: %v", err)
		}
		d := &delivery{m: &broker.Message{ID: string(key)}, key: key}
		b.ds, b.helds = append(b.ds, d), append(b.helds, h)
		want[d.m] = h.Token()
	}
	ctx := context.WithValue(context.Background(), batchKey{}, b)
	order := []int{0, 1, 2, 3, 4, 4, 3, 2, 1, 0, 2, 2, 0, 4}
	for _, i := range order {
		m := b.ds[i].m
		if tok, ok := MessageToken(ctx, m); !ok || tok != want[m] {
			t.Fatalf("MessageToken(%s) = %d, %v; want %d", m.ID, tok, ok, want[m])
		}
	}
	if _, ok := MessageToken(ctx, &broker.Message{ID: "k0"}); ok {
		t.Fatal("a message not in the batch (same id, another message) got a token")
	}
	if tok, ok := HeldToken(ctx, []byte("k3")); !ok || tok != want[b.ds[3].m] {
		t.Fatalf("HeldToken(k3) = %d, %v", tok, ok)
	}
	for _, h := range b.helds {
		_ = h.Release(context.Background(), nil)
	}
}
