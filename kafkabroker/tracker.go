package kafkabroker

// Offset tracking for one assigned partition: pure bookkeeping, no I/O, so
// the commit rule is unit-tested and fuzzed on its own.
//
// Records are appended in offset order (Kafka hands a partition's records
// out in order). An entry is settled by Ack or Term; the commit point is the
// offset of the first unsettled entry, or one past the last tracked record
// when all are settled. So the committed offset never passes an unsettled
// message, and offsets missing from the sequence (transaction markers,
// compaction) do not hold the commit back.

type entryState uint8

const (
	stateHanded  entryState = iota + 1 // with the handler
	stateWaiting                       // nak'd, waiting for its delay
	stateSettled                       // acked or termed
)

type entry struct {
	off        int64
	epoch      int32
	state      entryState
	deliveries int
	rec        any // the record, kept until settled for redelivery
}

type tracker struct {
	q    []*entry // unsettled prefix window in offset order; q[0] is the oldest
	next int64    // one past the last tracked offset; -1 before any

	commitOff   int64 // offset to commit (-1: nothing yet)
	commitEpoch int32
	committed   int64 // last offset the broker acknowledged (-1: none by us)

	handed, waiting int
}

func newTracker() *tracker {
	return &tracker{next: -1, commitOff: -1, commitEpoch: -1, committed: -1}
}

// add tracks a record handed to the handler. It returns nil for an offset
// already tracked (a re-fetch of something this assignment has seen).
func (t *tracker) add(off int64, epoch int32, rec any) *entry {
	if t.next >= 0 && off < t.next {
		return nil
	}
	e := &entry{off: off, epoch: epoch, state: stateHanded, deliveries: 1, rec: rec}
	t.q = append(t.q, e)
	t.next = off + 1
	t.handed++
	if t.commitOff < 0 {
		// Before anything settles the commit point is the first record:
		// committing it is a no-op, never a skip.
		t.commitOff, t.commitEpoch = off, epoch
	}
	return e
}

// settle marks e acked or termed and advances the commit point over the
// settled prefix. It reports false if e was not handed out or waiting.
func (t *tracker) settle(e *entry) bool {
	switch e.state {
	case stateHanded:
		t.handed--
	case stateWaiting:
		t.waiting--
	default:
		return false
	}
	e.state = stateSettled
	e.rec = nil
	i := 0
	for i < len(t.q) && t.q[i].state == stateSettled {
		i++
	}
	if i == 0 {
		return true
	}
	last := t.q[i-1]
	clear(t.q[:i])
	t.q = t.q[i:]
	if len(t.q) > 0 {
		t.commitOff, t.commitEpoch = t.q[0].off, t.q[0].epoch
	} else {
		t.commitOff, t.commitEpoch = last.off+1, last.epoch
	}
	return true
}

// nak moves a handed-out entry to waiting.
func (t *tracker) nak(e *entry) bool {
	if e.state != stateHanded {
		return false
	}
	e.state = stateWaiting
	t.handed--
	t.waiting++
	return true
}

// redeliver moves a waiting entry back to the handler.
func (t *tracker) redeliver(e *entry) bool {
	if e.state != stateWaiting {
		return false
	}
	e.state = stateHanded
	e.deliveries++
	t.waiting--
	t.handed++
	return true
}

// toCommit returns the commit point if it is ahead of what was committed.
func (t *tracker) toCommit() (off int64, epoch int32, ok bool) {
	if t.commitOff < 0 || t.commitOff <= t.committed {
		return 0, 0, false
	}
	return t.commitOff, t.commitEpoch, true
}

// committedAt records a successful commit of off.
func (t *tracker) committedAt(off int64) {
	if off > t.committed {
		t.committed = off
	}
}

func (t *tracker) unsettled() int { return t.handed + t.waiting }
