package chaos

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	"github.com/jackc/pgx/v5/pgxpool"
)

// guardEvents records two of the guard's events in the ledger, for the
// check of re-runs: a claim found lost while held or at its settle
// (Hooks.OnLeaseLost: taken over or removed; the table lost), and a
// completion the guard answered ErrUnrecorded and handed to its
// background (Hooks.OnUnrecorded, UnrecordedPending; the table pending),
// each with the claim's token. A re-run whose first holder's claim was
// found lost is the dual-write window (the fence row keeps one ledger
// row), unless that completion had been handed to the background first:
// then the caller was told ErrUnrecorded, and only the consumer's own
// record of that (the unrecorded table) explains the re-run.
//
// The guard's hooks must not block (they run on its heartbeat and
// background goroutines): rows are queued and written by one goroutine,
// retried, and flushed by close. A process killed first loses its queue;
// the check then finds no row for it, which never excuses anything (and
// a killed process's claims are excused as a fault's).
type guardEvents struct {
	pool   *pgxpool.Pool
	schema string
	pid    int

	mu    sync.Mutex
	queue []guardEvent
	wake  chan struct{}
	quit  chan struct{}
	ended chan struct{}
}

type guardEvent struct {
	table string // "lost" or "pending"
	key   string
	token uint64
	err   string
}

func newGuardEvents(pool *pgxpool.Pool, schema string, pid int) *guardEvents {
	g := &guardEvents{pool: pool, schema: schema, pid: pid,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), ended: make(chan struct{})}
	go g.run()
	return g
}

// hooks are the guard's hooks that feed g; lost is also called on each
// lost claim (a counter).
func (g *guardEvents) hooks(lost func()) idem.Hooks {
	return idem.Hooks{
		OnLeaseLost: func(_ context.Context, key []byte, token uint64, err error) {
			lost()
			g.add(guardEvent{table: "lost", key: string(key), token: token, err: fmt.Sprint(err)})
		},
		OnUnrecorded: func(_ context.Context, e idem.UnrecordedEvent) {
			if e.Phase == idem.UnrecordedPending && e.Action == idem.SettleComplete {
				g.add(guardEvent{table: "pending", key: string(e.Key), token: e.Token, err: fmt.Sprint(e.Err)})
			}
		},
	}
}

func (g *guardEvents) add(e guardEvent) {
	g.mu.Lock()
	g.queue = append(g.queue, e)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

func (g *guardEvents) take() []guardEvent {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.queue
	g.queue = nil
	return q
}

func (g *guardEvents) run() {
	defer close(g.ended)
	for {
		select {
		case <-g.wake:
			g.write(g.take())
		case <-g.quit:
			g.write(g.take())
			return
		}
	}
}

// write inserts es, each retried for up to a minute (the ledger is not
// the faulted store, but a row the check misses fails it).
func (g *guardEvents) write(es []guardEvent) {
	for _, e := range es {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = retry(ctx, func() error {
			_, err := g.pool.Exec(ctx, `INSERT INTO `+g.schema+`.`+e.table+` (msg_id, token, pid, err) VALUES ($1, $2::numeric, $3, $4)`,
				e.key, strconv.FormatUint(e.token, 10), g.pid, e.err)
			return err
		})
		cancel()
	}
}

// close writes what is queued and stops; call it once the guard is closed
// (its background's last answers are hooks too).
func (g *guardEvents) close() {
	close(g.quit)
	<-g.ended
}
