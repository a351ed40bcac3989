package txbatch_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/internal/txbatch"
	"github.com/idem-dev/idem/memstore"
)

// ops runs Run's store calls on memstore, outside any transaction: what
// is checked here is what Run asks for, not atomicity.
func ops(s *memstore.Store) txbatch.Ops[struct{}] {
	return txbatch.Ops[struct{}]{
		ClaimBatch: func(ctx context.Context, _ struct{}, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
			return s.ClaimBatch(ctx, reqs)
		},
		CompleteBatch: func(ctx context.Context, _ struct{}, cs []idem.Completion) ([]error, error) {
			return s.CompleteBatch(ctx, cs)
		},
		Release: func(ctx context.Context, _ struct{}, key []byte, token uint64, cause string) error {
			return s.Release(ctx, key, token, cause)
		},
		Fail: func(ctx context.Context, _ struct{}, key []byte, token uint64, cause string) error {
			return s.Fail(ctx, key, token, cause)
		},
	}
}

func items(ids ...string) []consumer.TxItem {
	out := make([]consumer.TxItem, len(ids))
	for i, id := range ids {
		out[i] = consumer.TxItem{Msg: &broker.Message{ID: id}, Key: []byte(id)}
	}
	return out
}

func TestRun(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	its := items("done", "dup", "retry", "perm", "huge")
	req := func(i int) idem.ClaimRequest {
		return idem.ClaimRequest{Key: its[i].Key, Lease: time.Minute, TTL: time.Hour}
	}
	c, _ := s.Claim(ctx, req(1))
	_ = s.Complete(ctx, its[1].Key, c.Record.Token, nil)
	var got []string
	outs, err := txbatch.Run(ctx, ops(s), struct{}{}, its, req, func(_ context.Context, _ struct{}, msgs []*broker.Message) ([][]byte, error) {
		for _, m := range msgs {
			got = append(got, m.ID)
		}
		return [][]byte{[]byte("r"), nil, nil, make([]byte, idem.MaxResultLen+1)},
			&consumer.PartialError{Failed: map[int]error{1: errors.New("later"), 2: idem.Permanent(errors.New("never"))}}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] != "done" || got[3] != "huge" {
		t.Fatalf("effect got %v; want the four acquired", got)
	}
	want := []struct {
		status consumer.TxStatus
		state  idem.State
	}{
		{consumer.TxDone, idem.StateCompleted},
		{consumer.TxDuplicate, idem.StateCompleted},
		{consumer.TxRetry, idem.StateReleased},
		{consumer.TxRejected, idem.StateFailed},
		{consumer.TxRejected, idem.StateFailed},
	}
	for i, w := range want {
		rec, err := s.Get(ctx, its[i].Key)
		if outs[i].Status != w.status || err != nil || rec.State != w.state {
			t.Errorf("%s: outcome %+v, record %s (%v); want status %d, %s", its[i].Msg.ID, outs[i], rec.State, err, w.status, w.state)
		}
	}
	if !errors.Is(outs[4].Err, idem.ErrResultTooLarge) {
		t.Errorf("huge: %v, want ErrResultTooLarge", outs[4].Err)
	}
}

func TestRunRefusesBadEffectAnswers(t *testing.T) {
	ctx := context.Background()
	for name, fn := range map[string]txbatch.Effect[struct{}]{
		"result count": func(context.Context, struct{}, []*broker.Message) ([][]byte, error) {
			return [][]byte{nil}, nil
		},
		"PartialError index": func(context.Context, struct{}, []*broker.Message) ([][]byte, error) {
			return nil, &consumer.PartialError{Failed: map[int]error{5: errors.New("x")}}
		},
		"whole batch": func(context.Context, struct{}, []*broker.Message) ([][]byte, error) {
			return nil, errors.New("rolled back")
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := memstore.New(memstore.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			its := items("a", "b")
			req := func(i int) idem.ClaimRequest {
				return idem.ClaimRequest{Key: its[i].Key, Lease: time.Minute, TTL: time.Hour}
			}
			_, err = txbatch.Run(ctx, ops(s), struct{}{}, its, req, fn)
			var ee *txbatch.EffectError
			if !errors.As(err, &ee) {
				t.Fatalf("Run = %v, want an *EffectError", err)
			}
		})
	}
}
