package broker

import "context"

// Readier is an optional Subscriber capability: whether the subscriber can
// deliver now, for readiness probes and for a start-up that waits for the
// broker. Subscribers that have it keep trying to reach an unreachable
// broker (from their start, and after losing it) instead of failing.
//
// WaitReady returns nil as soon as the subscriber is ready, at once if it
// is ready already, even when ctx is done (so a probe may call it with an
// expired context). Ready means connected with the subscription in place:
// rabbitbroker's queue declared and its consumer started; natsbroker's
// durable consumer created on the stream; kafkabroker's member joined to
// the group with its assignment (which may be empty: more members than
// partitions). Otherwise WaitReady waits until ctx ends and returns ctx's
// error, wrapping the last error met connecting where there is one; after
// Close it returns ErrClosed; an error no retry can fix (a server too old,
// a configuration the broker refuses) is returned at once.
type Readier interface {
	WaitReady(ctx context.Context) error
}
