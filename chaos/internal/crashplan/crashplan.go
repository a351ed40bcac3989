// Package crashplan parses the named crash points a chaos worker is armed
// with (chaos.EnvCrash: point@n[,point@n]). It needs nothing past the
// standard library, so that its fuzz target builds in seconds: fuzzing
// instruments every package the test binary links, and in package chaos
// that was the whole harness (NATS server, kfake, every store and broker
// client), a build of minutes for a parser of one line.
package crashplan

import (
	"fmt"
	"strconv"
	"strings"
)

// Env is the environment variable that arms a worker's crash points.
const Env = "IDEM_CHAOS_CRASH"

// Named crash points.
const (
	AfterClaim    = "after-claim"    // consumer: the guard claimed the key; the handler has not started the effect
	AfterEffect   = "after-effect"   // consumer: the effect is written, the claim not completed (tx mode: inside the transaction, before CompleteTx and COMMIT)
	AfterComplete = "after-complete" // consumer: the claim is completed, the broker not acked
	AfterPublish  = "after-publish"  // relay: the broker accepted the batch, the outbox rows are not marked sent
)

// Codes numbers the crash points for the workers' shared counters (0: none).
var Codes = map[string]int64{AfterClaim: 1, AfterEffect: 2, AfterComplete: 3, AfterPublish: 4}

// Name is the crash point of a code ("" for none).
func Name(code int64) string {
	for n, c := range Codes {
		if c == code {
			return n
		}
	}
	return ""
}

// Parse parses a plan, point@n comma separated (the worker dies the n-th
// time, n >= 1, it reaches point), into n by point. A plan with any bad
// part is refused whole, with an error naming Env.
func Parse(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "@")
		v, err := strconv.ParseInt(n, 10, 64)
		if _, known := Codes[name]; !ok || !known || err != nil || v < 1 {
			return nil, fmt.Errorf("chaos: %s: bad crash point %q (want point@n, n >= 1, point one of after-claim, after-effect, after-complete, after-publish)", Env, part)
		}
		out[name] = v
	}
	return out, nil
}
