package broker

import "errors"

// ErrRejected is wrapped by a Publish error when the broker refused a
// message itself, so that publishing the same message again fails the
// same way: it is too large, its topic or routing does not exist where
// that is permanent, or the broker finds it invalid. Adapters wrap it
// where they can tell (keeping their own exported errors, so errors.Is
// holds for both); an error that does not wrap it may be the broker's
// absence (idem.ErrUnavailable) or anything else.
//
// The outbox relay counts a rejected message's attempt even while the
// broker accepts nothing else (a round whose failures are all the
// broker's absence is an outage and uses up no message's attempts).
var ErrRejected = errors.New("broker: message rejected")
