package snowflake

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keytime"
)

// ID is a Snowflake id: a non-negative int64 whose bits are, from the top,
// a zero sign bit, the milliseconds since the layout's epoch, the worker id
// and a per-millisecond sequence. IDs of one worker grow with time; IDs of
// different workers in the same millisecond differ in the worker bits.
type ID int64

// String is the decimal form, the form keytime.Snowflake and keytime.SnowflakeBits read.
func (id ID) String() string { return strconv.FormatInt(int64(id), 10) }

// Bytes is the 8-byte big-endian form, which sorts like the number and is
// also read by keytime.
func (id ID) Bytes() []byte {
	u := uint64(id)
	return []byte{byte(u >> 56), byte(u >> 48), byte(u >> 40), byte(u >> 32), byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)}
}

// Defaults of a Layout: Twitter's split (41 bits of milliseconds, 10 of
// worker, 12 of sequence) from 2020-01-01 UTC, which lasts until 2089 and
// gives 1,024 workers 4,096 ids per millisecond each. keytime.Snowflake
// reads this layout.
var DefaultEpoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	DefaultTimeBits     = 41
	DefaultWorkerBits   = 10
	DefaultSequenceBits = 12

	// MinTimeBits keeps a layout usable for at least 2^35 ms (about 1.1 years).
	MinTimeBits = 35
)

// Layout says how an ID's 63 bits are split and from when time counts.
// The zero value is the default layout. TimeBits+WorkerBits+SequenceBits
// must be 63 when any of them is set.
type Layout struct {
	Epoch        time.Time // zero: DefaultEpoch
	TimeBits     uint      // milliseconds since Epoch; at least MinTimeBits
	WorkerBits   uint      // 0..20: up to 2^WorkerBits workers
	SequenceBits uint      // 1..22: up to 2^SequenceBits ids per worker per millisecond
}

// DefaultLayout is the zero Layout with its defaults filled in.
var DefaultLayout = Layout{}.withDefaults()

func (l Layout) withDefaults() Layout {
	if l.Epoch.IsZero() {
		l.Epoch = DefaultEpoch
	}
	if l.TimeBits == 0 && l.WorkerBits == 0 && l.SequenceBits == 0 {
		l.TimeBits, l.WorkerBits, l.SequenceBits = DefaultTimeBits, DefaultWorkerBits, DefaultSequenceBits
	}
	return l
}

// Validate checks the layout after defaults.
func (l Layout) Validate() error {
	l = l.withDefaults()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: snowflake: "+format, append([]any{idem.ErrInvalidArgument}, a...)...)
	}
	switch {
	case l.TimeBits+l.WorkerBits+l.SequenceBits != 63:
		return bad("layout bits %d+%d+%d must add up to 63", l.TimeBits, l.WorkerBits, l.SequenceBits)
	case l.TimeBits < MinTimeBits:
		return bad("layout has %d time bits, at least %d needed", l.TimeBits, MinTimeBits)
	case l.WorkerBits > 20:
		return bad("layout has %d worker bits, at most 20", l.WorkerBits)
	case l.SequenceBits < 1 || l.SequenceBits > 22:
		return bad("layout has %d sequence bits, want 1..22", l.SequenceBits)
	case l.Epoch.UnixMilli() < 0:
		return bad("epoch %s is before 1970", l.Epoch)
	}
	return nil
}

// MaxWorker is the largest worker id.
func (l Layout) MaxWorker() int64 { l = l.withDefaults(); return 1<<l.WorkerBits - 1 }

// MaxSequence is the largest sequence number in a millisecond.
func (l Layout) MaxSequence() int64 { l = l.withDefaults(); return 1<<l.SequenceBits - 1 }

// PerMillisecond is how many ids one worker can make per millisecond: the
// layout's ceiling on one generator's rate.
func (l Layout) PerMillisecond() int64 { return l.MaxSequence() + 1 }

// End is the first instant the layout cannot represent.
func (l Layout) End() time.Time {
	l = l.withDefaults()
	return time.UnixMilli(l.Epoch.UnixMilli() + 1<<l.TimeBits).UTC()
}

// KeyTime returns the keytime.Func reading this layout's ids (decimal text
// or 8 big-endian bytes), for the time-ordered and time-partitioned layouts
// of the SQL stores. For the default layout it equals keytime.Snowflake.
func (l Layout) KeyTime() keytime.Func {
	l = l.withDefaults()
	return keytime.SnowflakeBits(l.Epoch, l.WorkerBits+l.SequenceBits)
}

// Parts are the fields of an ID.
type Parts struct {
	Time     time.Time // millisecond precision, UTC
	Worker   int64
	Sequence int64
}

// Parse splits id into its parts. Every non-negative id parses.
func (l Layout) Parse(id ID) (Parts, error) {
	l = l.withDefaults()
	if id < 0 {
		return Parts{}, fmt.Errorf("%w: snowflake: negative id %d", idem.ErrInvalidArgument, id)
	}
	low := l.WorkerBits + l.SequenceBits
	ms := int64(id) >> low
	return Parts{
		Time:     time.UnixMilli(l.Epoch.UnixMilli() + ms).UTC(),
		Worker:   int64(id) >> l.SequenceBits & (1<<l.WorkerBits - 1),
		Sequence: int64(id) & (1<<l.SequenceBits - 1),
	}, nil
}

// ParseString parses the decimal form (no sign, no leading zeros) and
// splits it.
func (l Layout) ParseString(s string) (ID, Parts, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || s[0] == '+' || s[0] == '-' || len(s) > 1 && s[0] == '0' {
		return 0, Parts{}, fmt.Errorf("%w: snowflake: not an id: %q", idem.ErrInvalidArgument, s)
	}
	p, err := l.Parse(ID(v))
	return ID(v), p, err
}

// Compose builds the ID of p; p.Time is truncated to the millisecond. It
// fails when a part does not fit the layout.
func (l Layout) Compose(p Parts) (ID, error) {
	l = l.withDefaults()
	ms := p.Time.UnixMilli() - l.Epoch.UnixMilli()
	if p.Time.Before(l.Epoch) {
		ms = -1
	}
	switch {
	case ms < 0 || ms >= 1<<l.TimeBits:
		return 0, fmt.Errorf("%w: snowflake: time %s outside [%s, %s)", idem.ErrInvalidArgument, p.Time, l.Epoch, l.End())
	case p.Worker < 0 || p.Worker > l.MaxWorker():
		return 0, fmt.Errorf("%w: snowflake: worker %d outside [0, %d]", idem.ErrInvalidArgument, p.Worker, l.MaxWorker())
	case p.Sequence < 0 || p.Sequence > l.MaxSequence():
		return 0, fmt.Errorf("%w: snowflake: sequence %d outside [0, %d]", idem.ErrInvalidArgument, p.Sequence, l.MaxSequence())
	}
	return ID(ms<<(l.WorkerBits+l.SequenceBits) | p.Worker<<l.SequenceBits | p.Sequence), nil
}

// FirstAt is the smallest ID any worker can make at time t (worker and
// sequence 0): ids made at or after t are >= FirstAt(t), so a range scan
// by time needs no other index.
func (l Layout) FirstAt(t time.Time) (ID, error) { return l.Compose(Parts{Time: t}) }
