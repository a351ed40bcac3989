package streamsbroker

import (
	"context"
	"time"
)

// ackBatch is the most ids one XACK carries.
const ackBatch = 1000

// queueAck hands id to the subscriber's ack flusher (started with the first
// queued ack): Ack returns without waiting for Redis, and acks queued while
// an XACK is in flight go together in the next one. It reports false once
// Close has stopped the flusher (the caller then acks inline).
func (s *Subscriber) queueAck(id string) bool {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	if s.ackStopped {
		return false
	}
	s.ackIDs = append(s.ackIDs, id)
	if s.ackDone == nil {
		s.ackKick = make(chan struct{}, 1)
		s.ackStop = make(chan struct{})
		s.ackDone = make(chan struct{})
		go s.flushAcks()
	}
	select {
	case s.ackKick <- struct{}{}:
	default:
	}
	return true
}

// flushAcks sends queued acks until Close stops it, then sends what is left
// once. A failed XACK is retried with backoff; its entries stay pending
// meanwhile (reclaimed after AckWait if it keeps failing: the guard answers
// those redeliveries as duplicates).
func (s *Subscriber) flushAcks() {
	defer close(s.ackDone)
	wait := 50 * time.Millisecond
	for {
		stopping := false
		select {
		case <-s.ackKick:
		case <-s.ackStop:
			stopping = true
		}
		for {
			s.ackMu.Lock()
			ids := s.ackIDs
			s.ackIDs = nil
			s.ackMu.Unlock()
			if len(ids) == 0 {
				break
			}
			if err := s.xack(ids); err != nil {
				s.ackErrors.Add(1)
				s.cfg.Logger.Warn("streamsbroker: XACK failed; retrying (the entries stay pending until it succeeds)",
					"stream", s.cfg.Stream, "group", s.cfg.Group, "entries", len(ids), "err", err)
				s.ackMu.Lock()
				s.ackIDs = append(ids, s.ackIDs...)
				s.ackMu.Unlock()
				if stopping {
					return // Close's one last try failed: the entries are reclaimed after AckWait
				}
				select {
				case <-time.After(wait):
				case <-s.ackStop:
					stopping = true
				}
				wait = min(2*wait, time.Second)
				continue
			}
			wait = 50 * time.Millisecond
		}
		if stopping {
			return
		}
	}
}

func (s *Subscriber) xack(ids []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(ids) > 0 {
		n := min(len(ids), ackBatch)
		if err := s.cfg.Client.XAck(ctx, s.cfg.Stream, s.cfg.Group, ids[:n]...).Err(); err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// stopAcks stops the flusher after it sent what was queued (one try).
func (s *Subscriber) stopAcks() {
	s.ackMu.Lock()
	s.ackStopped = true
	done := s.ackDone
	s.ackMu.Unlock()
	if done != nil {
		close(s.ackStop)
		<-done
	}
}
