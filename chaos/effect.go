package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/chaos/internal/shm"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/e2etest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var (
	errPoison = errors.New("chaos: poison message")
	errFlaky  = errors.New("chaos: flaky handler failure")
)

// ledgerDDL makes a cell's ledger: one row per applied effect and NO
// unique constraint, so an effect applied twice shows as two rows; the
// fence table (fenced mode) with the highest token that applied each
// key's effect; and a row per effect found already applied by an earlier
// holder that never completed its claim (the harness checks each against
// the faults it injected); the acks with the completion unrecorded
// (consumer.Hooks.OnUnrecorded); and the guard's claims found lost and
// completions handed to its background (guardEvents), which explain some
// re-runs.
func ledgerDDL(schema string) string {
	return `CREATE SCHEMA ` + schema + `;
CREATE TABLE ` + schema + `.ledger (msg_id text NOT NULL, payload bytea, token numeric(20) NOT NULL, pid int NOT NULL,
	worker text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE ` + schema + `.fence (msg_id text PRIMARY KEY, token numeric(20) NOT NULL, pid int NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE ` + schema + `.rerun (msg_id text NOT NULL, old_token numeric(20) NOT NULL, old_pid int NOT NULL,
	old_at timestamptz NOT NULL, token numeric(20) NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE ` + schema + `.unrecorded (msg_id text NOT NULL, pid int NOT NULL, err text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE ` + schema + `.lost (msg_id text NOT NULL, token numeric(20) NOT NULL, pid int NOT NULL, err text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE ` + schema + `.pending (msg_id text NOT NULL, token numeric(20) NOT NULL, pid int NOT NULL, err text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp())`
}

// effect is the consumers' handler: poison and flaky messages fail, the
// others append their row to the ledger (see EffectTx, EffectFenced).
type effect struct {
	spec  Spec
	ctr   *shm.File
	crash *crasher
	ran   *sync.Map // messages whose effect this process applied, for AfterComplete
	pid   int
	st    *storeConn
	pool  *pgxpool.Pool // the ledger's (pg: the store's pool, through the proxy)
	// ledgerPool reaches the ledger directly (never through the store's
	// proxy).
	ledgerPool *pgxpool.Pool
	tried      sync.Map // flaky ids that failed once here
}

func (e *effect) handle(ctx context.Context, m *broker.Message) ([]byte, error) {
	e.ctr.Add(shm.InHandler, 1)
	defer e.ctr.Add(shm.InHandler, -1)
	e.crash.at(AfterClaim)
	if i, ok := e2etest.Index(m.ID); ok {
		// A message held now, for the stall: it waits for another
		// holder to take this one over.
		defer e.holding(i)()
		if err := e.fails(i, m); err != nil {
			return nil, err
		}
	}
	if err := e.delay(ctx); err != nil {
		return nil, err
	}
	key, _ := consumer.KeyFromContext(ctx)
	token, ok := consumer.TokenFromContext(ctx)
	if !ok {
		return nil, idem.Permanent(errors.New("chaos: no fencing token in the handler's context"))
	}
	var err error
	if e.spec.Effect == EffectTx {
		err = e.tx(ctx, m, key, token)
	} else {
		err = e.fenced(ctx, m, token)
	}
	if err != nil {
		return nil, err
	}
	e.ran.Store(m, true)
	return nil, nil
}

// holding records message i as one this process holds now (for the
// stall: it waits for another holder to take it over); the function
// returned forgets it.
func (e *effect) holding(i int) func() {
	held := int64(i) + 1
	e.ctr.Set(shm.HeldIdx, held)
	return func() { e.ctr.CompareAndSwap(shm.HeldIdx, held, 0) }
}

// fails is the handler's failure for message i, m: poison messages always
// fail (half of them with idem.Permanent), flaky ones the first time this
// process runs them.
func (e *effect) fails(i int, m *broker.Message) error {
	switch {
	case isPermanent(i, e.spec.Poison):
		e.ctr.Add(shm.Poisoned, 1)
		return idem.Permanent(errPoison)
	case isPoison(i, e.spec.Poison):
		e.ctr.Add(shm.Poisoned, 1)
		return errPoison
	case e2etest.Flaky(i):
		if _, again := e.tried.LoadOrStore(m.ID, true); !again {
			e.ctr.Add(shm.Flaked, 1)
			return errFlaky
		}
	}
	return nil
}

// delay takes the effect's time (Timing.EffectDelay), so that claims are
// in flight when faults strike.
func (e *effect) delay(ctx context.Context) error {
	if d := time.Duration(e.spec.Timing.EffectDelay); d > 0 && !sleepCtx(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// unrecorded records that this process acked m with its completion
// unrecorded (consumer.Hooks.OnUnrecorded). The ledger is not the faulted
// store, but it is retried for a while all the same: a re-run the check
// cannot match to a row here is a duplicate effect.
func (e *effect) unrecorded(ctx context.Context, ev consumer.UnrecordedEvent) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	_ = retry(ctx, func() error {
		_, err := e.ledgerPool.Exec(ctx, `INSERT INTO `+e.spec.Schema+`.unrecorded (msg_id, pid, err) VALUES ($1, $2, $3)`,
			ev.Msg.ID, e.pid, fmt.Sprint(ev.Err))
		return err
	})
}

func (e *effect) insert(ctx context.Context, tx pgx.Tx, m *broker.Message, token uint64) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.spec.Schema+`.ledger (msg_id, payload, token, pid, worker) VALUES ($1, $2, $3::numeric, $4, $5)`,
		m.ID, m.Payload, strconv.FormatUint(token, 10), e.pid, e.spec.Name)
	return err
}

// tx: the row and the claim's completion in one transaction (pgstore).
// A row of this very claim already there means an earlier try of this
// handler committed and only its answer was lost: CompleteTx repeats
// without error for the same token, so the row must not be written again.
func (e *effect) tx(ctx context.Context, m *broker.Message, key []byte, token uint64) error {
	applied := false
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+e.spec.Schema+`.ledger WHERE msg_id = $1 AND token = $2::numeric)`,
			m.ID, strconv.FormatUint(token, 10)).Scan(&mine); err != nil {
			return err
		}
		if !mine {
			if err := e.insert(ctx, tx, m, token); err != nil {
				return err
			}
			applied = true
		}
		e.crash.at(AfterEffect)
		return e.st.pgs.CompleteTx(ctx, tx, key, token, nil)
	})
	switch {
	case errors.Is(err, idem.ErrFenced):
		e.ctr.Add(shm.Fenced, 1)
	case err == nil && applied:
		e.ctr.Add(shm.Effects, 1)
	case err == nil:
		e.ctr.Add(shm.Reruns, 1)
	}
	return err
}

// fenced: the record is in another store. The effect's transaction takes
// the key's fence row: a larger token there means a newer holder (this
// one is stale: refused); the same token, an earlier try of this claim
// that committed; a smaller one, a previous holder that applied the effect
// and never completed its claim (crashed, stalled): the effect is not
// applied again, and the re-run is recorded for the harness to check.
func (e *effect) fenced(ctx context.Context, m *broker.Message, token uint64) error {
	outcome := ""
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) (err error) {
		outcome, err = e.fence(ctx, tx, m, token)
		return err
	})
	e.count(outcome, err)
	if err == nil {
		e.crash.at(AfterEffect)
	}
	return err
}

// fence applies m's effect under token in tx, as fenced describes, and
// says what it did: applied; mine (an earlier try of this claim
// committed); rerun (a previous holder's effect found, recorded); or
// fenced (a newer holder's found: nothing written, and an error wrapping
// idem.ErrFenced). Any other error leaves tx to roll back.
func (e *effect) fence(ctx context.Context, tx pgx.Tx, m *broker.Message, token uint64) (string, error) {
	tok := strconv.FormatUint(token, 10)
	tag, err := tx.Exec(ctx, `INSERT INTO `+e.spec.Schema+`.fence (msg_id, token, pid) VALUES ($1, $2::numeric, $3) ON CONFLICT (msg_id) DO NOTHING`,
		m.ID, tok, e.pid)
	if err != nil {
		return "", err
	}
	if tag.RowsAffected() == 1 {
		return "applied", e.insert(ctx, tx, m, token)
	}
	var oldTok string
	var oldPid int
	var oldAt time.Time
	if err := tx.QueryRow(ctx, `SELECT token::text, pid, at FROM `+e.spec.Schema+`.fence WHERE msg_id = $1 FOR UPDATE`, m.ID).Scan(&oldTok, &oldPid, &oldAt); err != nil {
		return "", err
	}
	old, err := strconv.ParseUint(oldTok, 10, 64)
	if err != nil {
		return "", err
	}
	switch {
	case old > token:
		return "fenced", fmt.Errorf("chaos: effect refused: %w (token %d, key's fence at %d)", idem.ErrFenced, token, old)
	case old == token:
		return "mine", nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+e.spec.Schema+`.rerun (msg_id, old_token, old_pid, old_at, token, pid) VALUES ($1, $2::numeric, $3, $4, $5::numeric, $6)`,
		m.ID, oldTok, oldPid, oldAt, tok, e.pid); err != nil {
		return "", err
	}
	_, err = tx.Exec(ctx, `UPDATE `+e.spec.Schema+`.fence SET token = $2::numeric, pid = $3, at = clock_timestamp() WHERE msg_id = $1`, m.ID, tok, e.pid)
	return "rerun", err
}

// count counts what fence did, once its transaction ended with err.
func (e *effect) count(outcome string, err error) {
	switch {
	case outcome == "fenced":
		e.ctr.Add(shm.Fenced, 1)
	case err != nil:
	case outcome == "applied":
		e.ctr.Add(shm.Effects, 1)
	default:
		e.ctr.Add(shm.Reruns, 1)
	}
}
