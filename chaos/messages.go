package chaos

// Messages are e2etest's: message i has id e2etest.ID(i) ("msg-0000042")
// and payload e2etest.Payload(i) ({"n":42}), so a ledger row carrying
// another message's payload is caught; e2etest.Index reads i back and
// e2etest.Flaky picks the messages that fail once per process. The poison
// rate is the harness's own (e2etest's is fixed at 1 in 500).

// isPoison: message i always fails its handler.
func isPoison(i, every int) bool { return every > 0 && i%every == 13 }

// isPermanent: a poison message that fails with idem.Permanent
// (dead-lettered at its first failure; the others use up MaxAttempts).
func isPermanent(i, every int) bool { return every > 0 && i%(2*every) == 13 }
