package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestIndexesStayConsistent drives random operations on a fake clock and
// checks after each round that the expiry index, the in-progress index and
// the stored counts agree with the records, and that Stats matches a scan.
func TestIndexesStayConsistent(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	s := openTemp(t, func(c *Config) { c.Clock = clk; c.SweepInterval = -1; c.SweepChunk = 7 })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	tokens := map[string]uint64{}
	for round := range 40 {
		for range 50 {
			key := fmt.Sprint("k", rng.IntN(40))
			lease := time.Duration(1+rng.IntN(5)) * time.Second
			ttl := time.Duration(1+rng.IntN(20)) * time.Second
			switch rng.IntN(9) {
			case 0, 1:
				c, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(key), Lease: lease, TTL: ttl})
				if err != nil {
					t.Fatal(err)
				}
				if c.Outcome == idem.OutcomeAcquired {
					tokens[key] = c.Record.Token
				}
			case 2:
				_ = s.Complete(ctx, []byte(key), tokens[key]+uint64(rng.IntN(2)), []byte("r"))
			case 3:
				_ = s.Release(ctx, []byte(key), tokens[key], "cause")
			case 4:
				_ = s.Fail(ctx, []byte(key), tokens[key], "bad")
			case 5:
				_ = s.Extend(ctx, []byte(key), tokens[key], lease)
			case 6:
				if err := s.Delete(ctx, []byte(key)); err != nil {
					t.Fatal(err)
				}
			case 7:
				reqs := []idem.ClaimRequest{{Key: []byte(key), Lease: lease, TTL: ttl}, {Key: []byte(key + "b"), Lease: lease, TTL: ttl}}
				if _, err := s.ClaimBatch(ctx, reqs); err != nil {
					t.Fatal(err)
				}
			case 8:
				cs := []idem.Completion{
					{Key: []byte(key), Token: tokens[key], Result: []byte("b")},
					{Key: []byte(key + "x"), Token: tokens[key+"x"] + 1},
					{Key: []byte(key), Token: tokens[key] + uint64(rng.IntN(2))},
				}
				if _, err := s.CompleteBatch(ctx, cs); err != nil {
					t.Fatal(err)
				}
			}
			clk.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		}
		if round%3 == 0 {
			if _, err := s.Purge(ctx, rng.IntN(20)); err != nil {
				t.Fatal(err)
			}
		}
		checkIndexes(t, s, clk.Now())
	}
}

func checkIndexes(t *testing.T, s *Store, now time.Time) {
	t.Helper()
	var live idem.Stats
	err := s.b.bolt.View(func(tx *bbolt.Tx) error {
		sp, err := spaceOf(tx, s.name)
		if err != nil {
			return err
		}
		var stored [4]int64
		nx, np := 0, 0
		err = sp.r.ForEach(func(k, v []byte) error {
			r, err := decode(k, v)
			if err != nil {
				return err
			}
			stored[r.state-idem.StateInProgress]++
			if r.expiresAt > now.UnixNano() {
				switch r.state {
				case idem.StateInProgress:
					live.InProgress++
				case idem.StateCompleted:
					live.Completed++
				case idem.StateFailed:
					live.Failed++
				case idem.StateReleased:
					live.Released++
				}
			}
			if sp.x.Get(expiryKey(r.expiresAt, k)) == nil {
				return fmt.Errorf("%q: no expiry entry", k)
			}
			if r.state == idem.StateInProgress && !keyIn(sp.p, progressKey(r.token, k)) {
				return fmt.Errorf("%q (%s): not in the in-progress index", k, r.state)
			}
			return nil
		})
		if err != nil {
			return err
		}
		_ = sp.x.ForEach(func(k, _ []byte) error {
			nx++
			if v := sp.r.Get(k[8:]); v == nil {
				err = fmt.Errorf("expiry entry for missing %q", k[8:])
			} else if r, _ := decode(k[8:], v); r.expiresAt != int64(binary.BigEndian.Uint64(k)) {
				err = fmt.Errorf("stale expiry entry for %q", k[8:])
			}
			return nil
		})
		if err != nil {
			return err
		}
		_ = sp.p.ForEach(func(k, _ []byte) error {
			np++
			if v := sp.r.Get(k[8:]); v == nil {
				err = fmt.Errorf("in-progress entry for missing %q", k[8:])
			} else if r, _ := decode(k[8:], v); r.state != idem.StateInProgress || r.token != binary.BigEndian.Uint64(k) {
				err = fmt.Errorf("stale in-progress entry for %q", k[8:])
			}
			return nil
		})
		if err != nil {
			return err
		}
		if nr := sp.r.Stats().KeyN; nx != nr {
			return fmt.Errorf("%d expiry entries for %d records", nx, nr)
		}
		if np != int(stored[0]) {
			return fmt.Errorf("%d in-progress entries for %d records", np, stored[0])
		}
		if c := sp.counts(); c != stored {
			return fmt.Errorf("stored counts %v, scan %v", c, stored)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st != live {
		t.Fatalf("Stats %+v, scan %+v", st, live)
	}
}

func keyIn(b *bbolt.Bucket, k []byte) bool {
	c := b.Cursor()
	got, _ := c.Seek(k)
	return got != nil && string(got) == string(k)
}

// ListInProgress pages through held keys in claim order; a takeover moves
// the key to the end, completed keys leave the list.
func TestListInProgressOrder(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	s := openTemp(t, func(c *Config) { c.Clock = clk; c.SweepInterval = -1 })
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d"} {
		if _, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(k), Lease: time.Second, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Second)
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte("a"), Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, []byte("c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, []byte("c"), r.Token, nil); err != nil {
		t.Fatal(err)
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		recs, next, err := s.ListInProgress(ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			got = append(got, string(r.Key))
		}
		if next == "" {
			break
		}
		if page > 5 {
			t.Fatal("cursor never ends")
		}
		cursor = next
	}
	if fmt.Sprint(got) != "[b d a]" {
		t.Fatalf("listed %v, want [b d a]", got)
	}
	if _, _, err := s.ListInProgress(ctx, "zz", 2); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("bad cursor: %v", err)
	}
}
