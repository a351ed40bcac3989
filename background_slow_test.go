package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/faultstore"
)

// TestBackgroundSlowStoreRecordsAll: hundreds of completions wait in the
// background while the store is down; it comes back slow (25ms a call).
// Every one must be recorded, none abandoned. A round used to share one
// 5s deadline across every entry, reading each record back first: the
// reads spent it and every completion of the round was refused at once
// (300 entries: 8 recorded in 40s, about one a round, the others retried
// until their budget ran out while their keys stayed in progress).
func TestBackgroundSlowStoreRecordsAll(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			fs := faultstore.New(newMem(t))
			var inner idem.Store = fs
			if batch {
				inner = fs.WithBatch()
			}
			slow := &slowStore{Store: inner}
			var st idem.Store = slow
			if batch {
				st = slowBatch{slow}
			}
			var recovered, abandoned atomic.Int64
			g := newGuard(t, st, idem.WithLease(2*time.Second), idem.WithHooks(idem.Hooks{
				OnUnrecorded: func(_ context.Context, e idem.UnrecordedEvent) {
					switch e.Phase {
					case idem.UnrecordedRecovered:
						recovered.Add(1)
					case idem.UnrecordedAbandoned:
						abandoned.Add(1)
					}
				},
			}))
			fs.Inject(faultstore.OpComplete, faultstore.Fault{Err: idem.ErrUnknownOutcome})
			fs.Inject(faultstore.OpGet, faultstore.Fault{Err: idem.ErrUnknownOutcome})
			const n = 300
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := g.Do(ctx, []byte(fmt.Sprint("k", i)), func(context.Context) ([]byte, error) { return nil, nil })
					if !errors.Is(err, idem.ErrUnrecorded) {
						t.Errorf("k%d: %v, want ErrUnrecorded", i, err)
					}
				}()
			}
			wg.Wait()
			slow.delay.Store(int64(25 * time.Millisecond))
			fs.Clear()
			// A liveness bound, not a timing claim: 300 calls of 25ms
			// take 7.5s; before the fix most were never recorded.
			deadline := time.Now().Add(2 * time.Minute)
			for recovered.Load()+abandoned.Load() < n && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if r, a := recovered.Load(), abandoned.Load(); r != n || a != 0 {
				t.Fatalf("%d of %d recorded in the background, %d abandoned", r, n, a)
			}
			for i := range n {
				rec, err := fs.Get(ctx, []byte(fmt.Sprint("k", i)))
				if err != nil || rec.State != idem.StateCompleted {
					t.Fatalf("k%d: %+v %v, want completed", i, rec, err)
				}
			}
		})
	}
}

// slowStore delays every call by delay (the store is slow, not down).
type slowStore struct {
	idem.Store
	delay atomic.Int64
}

func (s *slowStore) wait(ctx context.Context) error {
	d := time.Duration(s.delay.Load())
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, ctx.Err())
	}
}

func (s *slowStore) Get(ctx context.Context, k []byte) (idem.Record, error) {
	if err := s.wait(ctx); err != nil {
		return idem.Record{}, err
	}
	return s.Store.Get(ctx, k)
}

func (s *slowStore) Complete(ctx context.Context, k []byte, tok uint64, res []byte) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.Store.Complete(ctx, k, tok, res)
}

func (s *slowStore) Extend(ctx context.Context, k []byte, tok uint64, lease time.Duration) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.Store.Extend(ctx, k, tok, lease)
}

// slowBatch adds the inner store's CompleteBatch, as slow as one call.
type slowBatch struct{ *slowStore }

func (s slowBatch) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	return s.Store.(idem.BatchCompleter).CompleteBatch(ctx, cs)
}
