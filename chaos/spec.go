package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/idem-dev/idem/chaos/internal/crashplan"
)

// Environment of a worker process (the harness re-executes its own binary).
const (
	EnvRole   = "IDEM_CHAOS_ROLE"   // consumer, relay or store
	EnvSpec   = "IDEM_CHAOS_SPEC"   // the worker's Spec, JSON
	EnvCrash  = crashplan.Env       // named crash points: point@n[,point@n]: SIGKILL self the n-th time point is reached
	EnvClock  = "IDEM_CHAOS_CLOCK"  // initial offset of the consumer's clock (a Go duration), see Spec
	EnvListen = "IDEM_CHAOS_LISTEN" // store role: host:port to serve on
)

// Worker roles.
const (
	RoleConsumer = "consumer"
	RoleRelay    = "relay"
	RoleStore    = "store"
)

// Named crash points (EnvCrash).
const (
	AfterClaim    = crashplan.AfterClaim    // consumer: the guard claimed the key; the handler has not started the effect
	AfterEffect   = crashplan.AfterEffect   // consumer: the effect is written, the claim not completed (tx mode: inside the transaction, before CompleteTx and COMMIT)
	AfterComplete = crashplan.AfterComplete // consumer: the claim is completed, the broker not acked
	AfterPublish  = crashplan.AfterPublish  // relay: the broker accepted the batch, the outbox rows are not marked sent
)

// CrashPointName is the name of a crash point code (shm.CrashPoint).
func CrashPointName(code int64) string { return crashplan.Name(code) }

// Effect modes.
const (
	// EffectTx: the ledger row and the claim's completion commit in one
	// PostgreSQL transaction (pgstore's CompleteTx): a stale token rolls
	// the effect back (ErrFenced).
	EffectTx = "tx"
	// EffectFenced: the record lives elsewhere (Redis, bbolt, MariaDB);
	// the effect's transaction keeps the highest token per key in a fence
	// table and refuses a smaller one (a stale holder), and finds an
	// effect a previous holder applied without completing its claim.
	EffectFenced = "fenced"
)

// Duration is a time.Duration that reads and writes JSON as text ("1.5s").
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Spec is what a worker process runs.
type Spec struct {
	Role   string     `json:"role"`
	Cell   string     `json:"cell"`
	Name   string     `json:"name"` // consumer-1, relay-0...
	Shm    string     `json:"shm"`  // counter file
	Broker BrokerSpec `json:"broker"`
	Store  StoreSpec  `json:"store"`
	// LedgerURL is the PostgreSQL database of the ledger and the outbox
	// (pgx URL), Schema the cell's schema in it.
	LedgerURL string `json:"ledger_url"`
	Schema    string `json:"schema"`
	Effect    string `json:"effect"`
	Timing    Timing `json:"timing"`
	// Poison: message i is poison when i%Poison == 13 (0: none); half of
	// them (i%(2*Poison) == 13) fail with idem.Permanent.
	Poison int `json:"poison"`
	// Workers is each consumer's handler concurrency (consumer.Config.Workers;
	// 0: its default, 16).
	Workers int `json:"workers,omitempty"`
	// Batch is the consumer's batch size (Cell.Batch; 0: one message at a
	// time).
	Batch int `json:"batch,omitempty"`
}

// BrokerSpec says where the messages are.
type BrokerSpec struct {
	Kind    string   `json:"kind"` // nats or kafka
	URL     string   `json:"url,omitempty"`
	Brokers []string `json:"brokers,omitempty"`
	Stream  string   `json:"stream,omitempty"` // JetStream stream
	Topic   string   `json:"topic"`            // subject / topic of the messages
	DLQ     string   `json:"dlq"`              // dead-letter subject / topic
	Group   string   `json:"group"`            // durable consumer / consumer group
}

// StoreSpec says where the records are.
type StoreSpec struct {
	Kind   string `json:"kind"`   // pg, redis, bolt or mysql
	Addr   string `json:"addr"`   // host:port (through the harness's proxy for workers)
	Name   string `json:"name"`   // pg schema / redis prefix / mysql table
	Path   string `json:"path"`   // bolt file (store role)
	DBName string `json:"dbname"` // pg / mysql database
}

// Timing is the settings that decide how long faults must last: the
// guard's lease and the adapters' redelivery times. Zero fields take the
// library defaults.
type Timing struct {
	Lease              Duration `json:"lease"`                // guard lease (default 30s)
	AckWait            Duration `json:"ack_wait"`             // NATS AckWait (default 30s)
	SessionTimeout     Duration `json:"session_timeout"`      // Kafka session timeout (default 45s)
	RebalanceTimeout   Duration `json:"rebalance_timeout"`    // Kafka rebalance timeout (default 60s)
	StoreDownDelay     Duration `json:"store_down_delay"`     // consumer (default 5s)
	InProgressInterval Duration `json:"in_progress_interval"` // consumer (default 10s)
	EffectDelay        Duration `json:"effect_delay"`         // each effect takes this long, so claims are in flight
}

// Fast is the CI timing: a 3 s lease, 5 s ack wait, 3 s session timeout, so
// a fault that must outlast a lease and a redelivery takes seconds. The
// Kafka rebalance timeout is 6 s: kfake pushes a rebalance's deadline
// back by the whole timeout at every join, so with the default 60 s a
// group whose members keep being killed and restarted (each restart a
// join, each client giving up on its join after 70 s and joining again)
// never completes the rebalance (docs/reliability.md).
func Fast() Timing {
	return Timing{Lease: Duration(3 * time.Second), AckWait: Duration(5 * time.Second), SessionTimeout: Duration(3 * time.Second),
		RebalanceTimeout: Duration(6 * time.Second),
		StoreDownDelay:   Duration(time.Second), InProgressInterval: Duration(time.Second), EffectDelay: Duration(5 * time.Millisecond)}
}

// Defaults is the library's and adapters' default timing.
func Defaults() Timing { return Timing{EffectDelay: Duration(5 * time.Millisecond)} }

func (t Timing) lease() time.Duration { return or(t.Lease, 30*time.Second) }
func (t Timing) ackWait() time.Duration {
	return or(t.AckWait, 30*time.Second)
}
func (t Timing) session() time.Duration        { return or(t.SessionTimeout, 45*time.Second) }
func (t Timing) storeDownDelay() time.Duration { return or(t.StoreDownDelay, 5*time.Second) }

func or(d Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// redelivery is how long the broker takes to hand a dead or stalled
// consumer's messages to another one.
func (t Timing) redelivery(broker string) time.Duration {
	switch broker {
	case "kafka":
		return t.session()
	case "rabbit":
		// The broker requeues a stalled consumer's deliveries when it
		// finds its connection dead: two heartbeats (AckWait, default
		// 10 s) without a word.
		if t.AckWait == 0 {
			return 20 * time.Second
		}
		return 2 * t.ackWait()
	}
	return t.ackWait()
}

func readSpec() (Spec, error) {
	var s Spec
	if err := json.Unmarshal([]byte(os.Getenv(EnvSpec)), &s); err != nil {
		return s, fmt.Errorf("chaos worker: %s: %w", EnvSpec, err)
	}
	return s, nil
}
