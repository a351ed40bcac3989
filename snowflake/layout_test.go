package snowflake_test

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keytime"
	"github.com/idem-dev/idem/snowflake"
)

var layouts = []snowflake.Layout{
	{}, // default
	{Epoch: time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC), TimeBits: 45, WorkerBits: 8, SequenceBits: 10},
	{TimeBits: 42, WorkerBits: 0, SequenceBits: 21},
	{TimeBits: 35, WorkerBits: 20, SequenceBits: 8},
	{TimeBits: 62, WorkerBits: 0, SequenceBits: 1},
}

func TestLayoutValidate(t *testing.T) {
	for _, l := range layouts {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	for _, l := range []snowflake.Layout{
		{TimeBits: 41, WorkerBits: 10, SequenceBits: 13},                           // 64 bits
		{TimeBits: 34, WorkerBits: 10, SequenceBits: 19},                           // too short-lived
		{TimeBits: 40, WorkerBits: 23, SequenceBits: 0},                            // no sequence
		{TimeBits: 36, WorkerBits: 4, SequenceBits: 23},                            // sequence too wide
		{TimeBits: 37, WorkerBits: 21, SequenceBits: 5},                            // worker too wide
		{Epoch: time.Unix(-10, 0), TimeBits: 41, WorkerBits: 10, SequenceBits: 12}, // before 1970
	} {
		if err := l.Validate(); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%+v: err = %v, want ErrInvalidArgument", l, err)
		}
	}
}

// TestParseComposeRoundTrip: property, on every layout: Parse(Compose(p))
// is p for random in-range parts, and Compose(Parse(id)) is id for random
// ids; ids order like (time, worker, sequence).
func TestParseComposeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, l := range layouts {
		end := l.End()
		epoch := snowflake.DefaultEpoch
		if !l.Epoch.IsZero() {
			epoch = l.Epoch
		}
		span := end.UnixMilli() - epoch.UnixMilli()
		var prev snowflake.Parts
		var prevID snowflake.ID = -1
		for i := 0; i < 20000; i++ {
			p := snowflake.Parts{
				Time:     time.UnixMilli(epoch.UnixMilli() + r.Int64N(span)).UTC(),
				Worker:   r.Int64N(l.MaxWorker() + 1),
				Sequence: r.Int64N(l.MaxSequence() + 1),
			}
			id, err := l.Compose(p)
			if err != nil {
				t.Fatalf("%+v Compose(%+v): %v", l, p, err)
			}
			got, err := l.Parse(id)
			if err != nil || got != p {
				t.Fatalf("%+v Parse(Compose(%+v)) = %+v, %v", l, p, got, err)
			}
			if prevID >= 0 && (id < prevID) != less(p, prev) {
				t.Fatalf("%+v: id order of %+v and %+v differs from parts order", l, p, prev)
			}
			prev, prevID = p, id
			raw := snowflake.ID(r.Int64())
			rp, err := l.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			if back, err := l.Compose(rp); err != nil || back != raw {
				t.Fatalf("%+v Compose(Parse(%d)) = %d, %v", l, raw, back, err)
			}
		}
	}
}

func less(a, b snowflake.Parts) bool {
	if !a.Time.Equal(b.Time) {
		return a.Time.Before(b.Time)
	}
	if a.Worker != b.Worker {
		return a.Worker < b.Worker
	}
	return a.Sequence < b.Sequence
}

func TestComposeOutOfRange(t *testing.T) {
	l := snowflake.DefaultLayout
	for _, p := range []snowflake.Parts{
		{Time: l.Epoch.Add(-time.Millisecond)},
		{Time: l.End()},
		{Time: l.Epoch, Worker: 1024},
		{Time: l.Epoch, Worker: -1},
		{Time: l.Epoch, Sequence: 4096},
	} {
		if _, err := l.Compose(p); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Compose(%+v): %v, want ErrInvalidArgument", p, err)
		}
	}
	if _, err := l.Parse(-1); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Parse(-1): %v", err)
	}
}

// TestKeyTime: the layout's keytime.Func reads the time Parse reads, from
// both the decimal and the binary form; for the default layout it agrees
// with keytime.Snowflake(DefaultEpoch).
func TestKeyTime(t *testing.T) {
	at := time.Date(2026, 12, 1, 15, 4, 5, 678e6, time.UTC)
	for _, l := range layouts {
		if !l.End().After(at) || l.TimeBits > 43 { // keytime reads up to 2^43 ms (292 years) after the epoch
			continue
		}
		id, err := l.Compose(snowflake.Parts{Time: at, Worker: l.MaxWorker(), Sequence: l.MaxSequence()})
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range [][]byte{[]byte(id.String()), id.Bytes()} {
			got, err := l.KeyTime()(key)
			if err != nil || !got.Equal(at) {
				t.Errorf("%+v KeyTime(%q) = %v, %v; want %v", l, key, got, err, at)
			}
		}
	}
	id, _ := snowflake.DefaultLayout.Compose(snowflake.Parts{Time: at, Worker: 7, Sequence: 9})
	got, err := keytime.Snowflake(snowflake.DefaultEpoch)([]byte(id.String()))
	if err != nil || !got.Equal(at) {
		t.Errorf("keytime.Snowflake = %v, %v", got, err)
	}
	first, _ := snowflake.DefaultLayout.FirstAt(at)
	if first > id {
		t.Errorf("FirstAt(%v) = %d > an id made then (%d)", at, first, id)
	}
}

func TestParseString(t *testing.T) {
	l := snowflake.DefaultLayout
	for _, s := range []string{"", "-1", "+5", "007", "12a", "9223372036854775808", " 1"} {
		if _, _, err := l.ParseString(s); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("ParseString(%q): %v, want ErrInvalidArgument", s, err)
		}
	}
	id, p, err := l.ParseString("0")
	if err != nil || id != 0 || !p.Time.Equal(l.Epoch) {
		t.Errorf("ParseString(0) = %d %+v %v", id, p, err)
	}
}

// FuzzParseString: ParseString never panics; what it accepts formats back
// to the same text and composes back to the same id.
func FuzzParseString(f *testing.F) {
	for _, s := range []string{"0", "1", "9223372036854775807", "1863564937592832001", "-3", "01", "+1", "x"} {
		f.Add(s)
	}
	l := snowflake.DefaultLayout
	f.Fuzz(func(t *testing.T, s string) {
		id, p, err := l.ParseString(s)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("error %v does not match ErrInvalidArgument", err)
			}
			return
		}
		if id.String() != s || strconv.FormatInt(int64(id), 10) != s {
			t.Fatalf("ParseString(%q) = %d", s, id)
		}
		back, err := l.Compose(p)
		if err != nil || back != id {
			t.Fatalf("Compose(%+v) = %d, %v; want %d", p, back, err, id)
		}
	})
}
