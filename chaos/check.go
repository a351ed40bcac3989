package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/chaos/internal/shm"
	"github.com/idem-dev/idem/e2etest"
)

// Result is a cell's verdict.
type Result struct {
	Cell
	Seed          uint64  `json:"seed"`
	Messages      int     `json:"messages"`      // originals committed to the outbox
	DupPublishes  int64   `json:"dup_publishes"` // published a second time by the producer
	Poison        int     `json:"poison"`        // poison messages among them
	Faults        []Fault `json:"faults"`        // what was injected, and what each hit
	Injected      int     `json:"faults_injected"`
	Hit           int     `json:"faults_hit"`
	DupDeliveries int64   `json:"duplicate_deliveries"` // deliveries of keys already completed (acked without running)
	DupEffects    int     `json:"duplicate_effects"`    // effects beyond one per message (must be 0)
	Lost          int     `json:"lost"`                 // messages with no effect and no dead letter (must be 0)
	Reruns        int     `json:"reruns_after_fault"`   // effects a killed/stalled holder applied without completing, found by the next one
	// RerunsUnrecorded: of Reruns, those whose first holder had acked the
	// message with its completion unrecorded (idem.ErrUnrecorded).
	RerunsUnrecorded int `json:"reruns_after_unrecorded"`
	// RerunsLost: of Reruns, those whose first holder learned that its
	// claim was lost (taken over) before its completion was recorded.
	RerunsLost int `json:"reruns_after_lost_claim"`
	// DeadLetterRepublished: extra copies of a dead letter with the same
	// dead-letter id, on a broker without publish dedup (RabbitMQ): a
	// publish whose outcome was unknown, retried.
	DeadLetterRepublished int `json:"dead_letter_republished,omitempty"`
	// Unrecorded: messages acked with their completion unrecorded.
	Unrecorded   int64    `json:"unrecorded"`
	Fenced       int64    `json:"fenced"` // effects of stale holders refused, and leases found lost
	DeadLettered int      `json:"dead_lettered"`
	Requeued     int64    `json:"outbox_requeued"` // outbox rows failed by the relay and re-queued by the harness
	Stuck        int      `json:"stuck"`           // keys in progress past their lease after the drain
	MsgsPerSec   float64  `json:"msgs_per_sec"`
	Elapsed      float64  `json:"elapsed_s"`
	Pass         bool     `json:"pass"`
	Problems     []string `json:"problems,omitempty"`
}

// Line is a one-line summary.
func (r Result) Line() string {
	v := "PASS"
	if !r.Pass {
		v = "FAIL"
	}
	s := fmt.Sprintf("%s %s: %d msgs, faults %d/%d hit, dup deliveries %d, dup effects %d, lost %d, %.0f msgs/s",
		v, r.Cell, r.Messages, r.Hit, r.Injected, r.DupDeliveries, r.DupEffects, r.Lost, r.MsgsPerSec)
	if len(r.Problems) > 0 {
		s += "; " + strings.Join(r.Problems, "; ")
	}
	return s
}

// publishDedup: the broker drops a message published again with the same
// id (JetStream's Nats-Msg-Id window, the streams adapter's dedup window).
// Kafka (a new producer session) and RabbitMQ do not.
func publishDedup(broker string) bool { return broker == "nats" || broker == "streams" }

func (c *cell) check(ctx context.Context, res Result) Result {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	n := c.r.cfg.Messages
	res.Messages = int(c.produced.Load())
	res.DupPublishes = c.published.Load()
	res.Poison = poisons(n, c.poison)
	res.Requeued = c.requeued.Load()
	end := c.drainedAt
	if end.IsZero() {
		end = time.Now()
	}
	res.Elapsed = end.Sub(c.start).Seconds()
	if res.Elapsed > 0 {
		res.MsgsPerSec = float64(res.Messages) / res.Elapsed
	}
	var tot shm.Values
	for _, w := range c.consumers {
		tot = shm.Sum(tot, w.totals())
	}
	res.DupDeliveries = tot[shm.Duplicates]
	res.Fenced = tot[shm.Fenced] + tot[shm.LeaseLost]
	res.Unrecorded = tot[shm.Unrecorded]

	// The ledger: every message's effect exactly once, with its payload.
	count := map[string]int{}
	rows, err := c.ledger.Query(ctx, `SELECT msg_id, payload FROM `+c.name+`.ledger`)
	if err != nil {
		c.problem("read ledger: %v", err)
	} else {
		unknown, wrong := 0, 0
		for rows.Next() {
			var id string
			var p []byte
			if err := rows.Scan(&id, &p); err != nil {
				c.problem("read ledger: %v", err)
				break
			}
			count[id]++
			i, ok := e2etest.Index(id)
			switch {
			case !ok || i >= n:
				unknown++
			case string(p) != string(e2etest.Payload(i)):
				wrong++
			}
		}
		rows.Close()
		if unknown > 0 {
			c.problem("%d ledger rows carry an id that was never published", unknown)
		}
		if wrong > 0 {
			c.problem("%d ledger rows carry another message's payload", wrong)
		}
	}
	dead, deadIDs, err := c.admin.deadLetterCopies(ctx)
	if err != nil {
		c.problem("read dead letters: %v", err)
	}
	var twice, missing, poisonRan, deadTwice, deadMissing, goodDead []string
	for i := range n {
		id := e2etest.ID(i)
		k, d := count[id], dead[id]
		res.DeadLettered += d
		if isPoison(i, c.poison) {
			if k > 0 {
				poisonRan = append(poisonRan, id)
			}
			switch {
			case d == 0:
				deadMissing = append(deadMissing, id)
			case d > 1 && !publishDedup(c.Broker) && len(deadIDs[id]) == 1:
				// Kafka and RabbitMQ drop no republished id: a dead
				// letter published again (its confirm lost when the
				// broker stopped, or its record not written before the
				// dead-letter claim was taken over: "dead letter
				// published but not recorded; a redelivery may publish
				// it again (same id)") lands twice with the same
				// dead-letter id (docs/consumer.md). Counted, not a
				// second effect; two different ids would be.
				res.DeadLetterRepublished += d - 1
			case d > 1:
				deadTwice = append(deadTwice, fmt.Sprintf("%s x%d", id, d))
			}
			continue
		}
		switch {
		case k == 0:
			missing = append(missing, id)
		case k > 1:
			twice = append(twice, fmt.Sprintf("%s x%d", id, k))
			res.DupEffects += k - 1
		}
		if d > 0 {
			goodDead = append(goodDead, id)
		}
	}
	res.DupEffects += len(deadTwice) + len(poisonRan)
	res.Lost = len(missing) + len(deadMissing)
	report := func(what string, ids []string) {
		if len(ids) > 0 {
			c.problem("%d %s (e.g. %s)", len(ids), what, strings.Join(ids[:min(5, len(ids))], ", "))
		}
	}
	report("messages applied more than once", twice)
	report("messages lost (no effect, not dead-lettered)", missing)
	report("poison messages not dead-lettered", deadMissing)
	report("poison messages dead-lettered more than once", deadTwice)
	if res.DeadLetterRepublished > 0 {
		c.logf("%d dead letters republished with the same dead-letter id (no publish dedup on %s)", res.DeadLetterRepublished, c.Broker)
	}
	report("poison messages had an effect", poisonRan)
	report("good messages dead-lettered", goodDead)

	// Effects a previous holder applied without completing (re-runs, each
	// absorbed by the fence row): see judgeRerun.
	rr, err := c.ledger.Query(ctx, `SELECT r.msg_id, r.old_pid, r.pid,
		EXISTS (SELECT 1 FROM `+c.name+`.unrecorded u WHERE u.msg_id = r.msg_id AND u.pid = r.old_pid),
		EXISTS (SELECT 1 FROM `+c.name+`.lost l WHERE l.msg_id = r.msg_id AND l.pid = r.old_pid AND l.token = r.old_token),
		EXISTS (SELECT 1 FROM `+c.name+`.pending p WHERE p.msg_id = r.msg_id AND p.pid = r.old_pid AND p.token = r.old_token)
		FROM `+c.name+`.rerun r`)
	if err != nil {
		c.problem("read reruns: %v", err)
	} else {
		var bad []string
		for rr.Next() {
			var r rerun
			if err := rr.Scan(&r.ID, &r.OldPid, &r.Pid, &r.Unrecorded, &r.Lost, &r.Pending); err != nil {
				c.problem("read reruns: %v", err)
				break
			}
			c.fmu.Lock()
			why := c.faultPids[r.OldPid]
			c.fmu.Unlock()
			switch v, reason := judgeRerun(r, why, count[r.ID]); v {
			case rerunFault:
				res.Reruns++
			case rerunUnrecorded:
				res.Reruns++
				res.RerunsUnrecorded++
			case rerunLost:
				res.Reruns++
				res.RerunsLost++
			default:
				bad = append(bad, fmt.Sprintf("%s (pid %d after pid %d: %s)", r.ID, r.Pid, r.OldPid, reason))
			}
		}
		rr.Close()
		res.DupEffects += len(bad)
		report("effects run again although their first holder was alive and unfaulted", bad)
	}

	// No key left in progress past its lease.
	st, err := openStore(ctx, c.spec, c.storeAddr)
	if err != nil {
		c.problem("open store for the check: %v", err)
	} else {
		var (
			mu     sync.Mutex
			stuck  []string
			states = map[string]int{}
			wg     sync.WaitGroup
			next   atomic.Int64
		)
		now := time.Now()
		for range 8 {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
					rec, err := st.store.Get(ctx, []byte(e2etest.ID(i)))
					mu.Lock()
					switch {
					case errors.Is(err, idem.ErrNotFound):
						states["absent"]++
					case err != nil:
						states["error"]++
						if states["error"] == 1 {
							c.problem("read record %s for the check: %v", e2etest.ID(i), err)
						}
					default:
						states[rec.State.String()]++
						if rec.State == idem.StateInProgress && rec.LeaseUntil.Before(now) {
							stuck = append(stuck, e2etest.ID(i))
						}
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		sort.Strings(stuck)
		st.close()
		res.Stuck = len(stuck)
		report("keys in progress past their lease", stuck)
		want := map[string]int{"completed": n - res.Poison, "failed": res.Poison}
		if fmt.Sprint(states) != fmt.Sprint(want) {
			c.logf("records: %v (want %v)", states, want)
		}
	}

	// The faults, and whether each hit in-flight work.
	c.fmu.Lock()
	res.Faults = append([]Fault(nil), c.faults...)
	c.fmu.Unlock()
	sort.SliceStable(res.Faults, func(i, j int) bool { return res.Faults[i].At < res.Faults[j].At })
	res.Injected = len(res.Faults)
	stalls := 0
	for _, f := range res.Faults {
		if f.Hit {
			res.Hit++
		} else if c.r.cfg.Strict {
			c.problem("fault %s on %s at %s hit no in-flight work: %s", f.Kind, f.Target, f.At, f.Evidence)
		}
		if f.Kind == "sigstop" {
			stalls++
		}
	}
	if c.r.cfg.Strict && res.Injected == 0 {
		c.problem("no fault was injected")
	}
	if c.r.cfg.Strict && c.Scenario == "stall" && stalls > 0 && res.Fenced == 0 {
		c.problem("no stale worker was fenced after %d stalls", stalls)
	}
	c.fmu.Lock()
	res.Problems = append(res.Problems, c.problems...)
	c.fmu.Unlock()
	res.Pass = res.DupEffects == 0 && res.Lost == 0 && len(res.Problems) == 0
	return res
}

// rerun is a re-run the fence row recorded: message ID's effect, applied
// under OldPid's claim (the fence row's token, old_token), found by Pid's
// later claim and not applied again.
type rerun struct {
	ID          string
	OldPid, Pid int
	// Unrecorded: OldPid acked ID with its completion unrecorded
	// (consumer.Hooks.OnUnrecorded; the unrecorded table).
	Unrecorded bool
	// Lost: OldPid's guard found that very claim lost, taken over or
	// removed, while held or at its completion (Hooks.OnLeaseLost; the
	// lost table).
	Lost bool
	// Pending: OldPid's guard answered that claim's completion
	// ErrUnrecorded and handed it to its background (the pending table).
	Pending bool
}

type rerunVerdict int

const (
	rerunBad        rerunVerdict = iota // a duplicate effect (absorbed by the fence, but a bug)
	rerunFault                          // the first holder was killed, crashed or stalled
	rerunUnrecorded                     // the first holder acked with its completion unrecorded
	rerunLost                           // the first holder's claim was found lost before its completion
)

// judgeRerun says whether r is accounted for. faulted is why a fault took
// r.OldPid's claims ("" if none did); rows is the message's ledger rows.
//
// A re-run is expected after a fault took the first holder's claims. A
// live, unfaulted holder's effect runs again only in the window of
// docs/guard.md: its lease lapsed before its completion was recorded (a
// store restart, outage or partition), and another process took the key
// over. Its first holder then either acked the message with the
// completion unrecorded (the consumer records that: Unrecorded), or was
// told its claim was lost (ErrFenced on Complete or CompleteBatch, or the
// heartbeat found it taken over: Lost; the consumer naks it as "claim
// lost before completion"). A loss found only after the guard had handed
// the completion to its background (Pending) is no excuse of its own: the
// caller was told ErrUnrecorded then, and the consumer must have recorded
// that ack (a consumer that ignores the error does not). The same process
// again is never the window: its guard answers its own claims in
// progress (the holding set). And the ledger must still hold the
// message's one effect row: the fence absorbs a re-run, a second row is a
// duplicate effect whatever explains it.
func judgeRerun(r rerun, faulted string, rows int) (rerunVerdict, string) {
	switch {
	case rows != 1:
		return rerunBad, fmt.Sprintf("the ledger holds %d effect rows for it", rows)
	case faulted != "":
		return rerunFault, faulted
	case r.Pid == r.OldPid && (r.Unrecorded || r.Lost):
		return rerunBad, "the same process again, which holds its own claims in progress"
	case r.Unrecorded:
		return rerunUnrecorded, "its first holder acked it with the completion unrecorded"
	case r.Lost && !r.Pending:
		return rerunLost, "its first holder's claim was found lost before its completion"
	case r.Lost:
		return rerunBad, "its first holder's claim was found lost after its completion was answered unrecorded, and no unrecorded ack was recorded"
	}
	return rerunBad, "which no fault touched"
}
