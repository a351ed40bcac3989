package chaos

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/broker/membroker"
	"github.com/idem-dev/idem/chaos/internal/remotestore"
	"github.com/idem-dev/idem/consumer"
	"github.com/idem-dev/idem/httpapi"
	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/kafkabroker"
	"github.com/idem-dev/idem/memstore"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/memoutbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Bad input at each entry point: empty, oversized, NUL, invalid UTF-8 and
// malformed values. Keys are raw bytes (NUL and invalid UTF-8 are valid
// keys, compared exactly); everything else out of range gets a clear
// error and stores nothing.

var (
	nulKey  = []byte("k\x00nul")
	utf8Key = []byte("k\xff\xfe")
	bigKey  = []byte(strings.Repeat("k", idem.MaxKeyLen+1))
	maxKey  = []byte(strings.Repeat("m", idem.MaxKeyLen))
)

// badInputStores are the stores the guard table runs on: in memory, the
// embedded file store, and the embedded store behind the harness's
// store server (remotestore, which must validate before it sends).
func badInputStores(t *testing.T) map[string]idem.Store {
	t.Helper()
	mem, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bolt, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "a.db")})
	if err != nil {
		t.Fatal(err)
	}
	served, err := boltstore.Open(boltstore.Config{Path: filepath.Join(t.TempDir(), "b.db")})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serveStore(t, served)
	remote := remotestore.Dial(addr, 5*time.Second)
	t.Cleanup(func() {
		remote.Close()
		stop()
		served.Close()
		bolt.Close()
		mem.Close()
	})
	return map[string]idem.Store{"memstore": mem, "boltstore": bolt, "remotestore": remote}
}

func storedKeys(t *testing.T, st idem.Store, keys ...[]byte) []string {
	t.Helper()
	var out []string
	for _, k := range keys {
		if idem.ValidateKey(k) != nil {
			continue
		}
		if _, err := st.Get(context.Background(), k); err == nil {
			out = append(out, fmt.Sprintf("%q", k))
		} else if !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("Get %q: %v", k, err)
		}
	}
	return out
}

// TestBadInputGuard: the library API (Guard.Do, Acquire, AcquireBatch)
// with bad keys, fingerprints, leases, TTLs and results.
func TestBadInputGuard(t *testing.T) {
	big := func(n int) []byte { return make([]byte, n) }
	for name, st := range badInputStores(t) {
		t.Run(name, func(t *testing.T) {
			g, err := idem.NewGuard(st, idem.WithLogger(quiet()))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ctx := context.Background()
			for _, tc := range []struct {
				name    string
				key     []byte
				opts    []idem.CallOption
				result  []byte
				want    error    // nil: accepted
				stored  bool     // a record exists afterwards under key
				runs    int      // handler runs
				absent  [][]byte // keys that must not exist (prefixes, neighbours)
				clearly string   // part of the error text
			}{
				{name: "empty key", key: nil, want: idem.ErrInvalidKey, clearly: "key"},
				{name: "empty non-nil key", key: []byte{}, want: idem.ErrInvalidKey, clearly: "key"},
				{name: "key over the limit", key: bigKey, want: idem.ErrInvalidKey, clearly: "1025"},
				{name: "key at the limit", key: maxKey, stored: true, runs: 1},
				{name: "NUL in key", key: nulKey, stored: true, runs: 1, absent: [][]byte{[]byte("k"), []byte("k\x00"), []byte("k\x00nu")}},
				{name: "invalid UTF-8 key", key: utf8Key, stored: true, runs: 1, absent: [][]byte{[]byte("k\ufffd\ufffd"), []byte("k")}},
				{name: "fingerprint over the limit", key: []byte("fp"), opts: []idem.CallOption{idem.WithFingerprint(big(idem.MaxFingerprintLen + 1))}, want: idem.ErrInvalidArgument, clearly: "fingerprint"},
				{name: "negative lease", key: []byte("lease-neg"), opts: []idem.CallOption{idem.WithCallLease(-time.Second)}, want: idem.ErrInvalidArgument, clearly: "lease"},
				{name: "lease over the limit", key: []byte("lease-big"), opts: []idem.CallOption{idem.WithCallLease(idem.MaxLease + time.Hour)}, want: idem.ErrInvalidArgument, clearly: "lease"},
				{name: "negative ttl", key: []byte("ttl-neg"), opts: []idem.CallOption{idem.WithCallTTL(-time.Hour)}, want: idem.ErrInvalidArgument, clearly: "ttl"},
				{name: "ttl over the limit", key: []byte("ttl-big"), opts: []idem.CallOption{idem.WithCallTTL(idem.MaxTTL + time.Hour)}, want: idem.ErrInvalidArgument, clearly: "ttl"},
				// The effect ran, so the key is recorded as failed (never
				// re-run); the caller gets a clear error.
				{name: "result over the limit", key: []byte("result-big"), result: big(idem.MaxResultLen + 1), want: idem.ErrResultTooLarge, stored: true, runs: 1, clearly: "MaxResultLen"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					runs := 0
					_, err := g.Do(ctx, tc.key, func(context.Context) ([]byte, error) { runs++; return tc.result, nil }, tc.opts...)
					switch {
					case tc.want == nil && err != nil:
						t.Fatalf("Do: %v", err)
					case tc.want != nil && !errors.Is(err, tc.want):
						t.Fatalf("Do = %v, want %v", err, tc.want)
					case tc.want != nil && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.clearly)):
						t.Fatalf("error %q does not say %q", err, tc.clearly)
					}
					if runs != tc.runs {
						t.Fatalf("handler ran %d times, want %d", runs, tc.runs)
					}
					got := storedKeys(t, st, append([][]byte{tc.key}, tc.absent...)...)
					want := []string(nil)
					if tc.stored {
						want = []string{fmt.Sprintf("%q", tc.key)}
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("stored %v, want %v", got, want)
					}
					if tc.stored && tc.want == nil {
						// A duplicate replays: the exact bytes are the key.
						if _, err := g.Do(ctx, tc.key, func(context.Context) ([]byte, error) { runs++; return nil, nil }); err != nil || runs != 1 {
							t.Fatalf("duplicate: %v, %d runs", err, runs)
						}
					}
					// Acquire refuses the same input the same way.
					if tc.want != nil && tc.want != idem.ErrResultTooLarge {
						if h, _, err := g.Acquire(ctx, tc.key, tc.opts...); !errors.Is(err, tc.want) {
							if h != nil {
								_ = h.Release(ctx, nil)
							}
							t.Fatalf("Acquire = %v, want %v", err, tc.want)
						}
					}
				})
			}
			t.Run("batch: bad entries fail alone", func(t *testing.T) {
				items := []idem.BatchItem{{Key: []byte("batch-ok")}, {Key: nil}, {Key: bigKey}, {Key: []byte("batch-fp"), Fingerprint: big(idem.MaxFingerprintLen + 1)}, {Key: []byte("batch-nul\x00")}}
				acq, err := g.AcquireBatch(ctx, items)
				if err != nil {
					t.Fatal(err)
				}
				for i, a := range acq {
					bad := i >= 1 && i <= 3
					if bad != (a.Err != nil) || (bad && !errors.Is(a.Err, idem.ErrInvalidKey) && !errors.Is(a.Err, idem.ErrInvalidArgument)) {
						t.Fatalf("item %d: %+v", i, a)
					}
					if a.Held != nil {
						if err := a.Held.Complete(ctx, nil); err != nil {
							t.Fatal(err)
						}
					}
				}
				if got := storedKeys(t, st, []byte("batch-ok"), []byte("batch-fp"), []byte("batch-nul\x00"), []byte("batch-nul")); len(got) != 2 {
					t.Fatalf("stored %v, want batch-ok and batch-nul\\x00", got)
				}
			})
		})
	}
}

// msgCase is a message with bad headers and what the consumer must do with
// it on each broker.
type msgCase struct {
	name    string
	id      string            // "" with noID: no id header at all
	noID    bool              // publish without any id header
	headers map[string]string // extra headers
	payload []byte
	// dead: dead-lettered with a reason naming the key, nothing stored;
	// otherwise handled exactly once, under its id as the key.
	dead bool
}

func msgCases() []msgCase {
	return []msgCase{
		{name: "plain", id: "bad-plain", payload: []byte("{}")},
		{name: "no id header", noID: true, payload: []byte("no-id"), dead: true},
		{name: "id over the key limit", id: "bad-" + strings.Repeat("x", idem.MaxKeyLen), dead: true},
		{name: "NUL in id", id: "bad-nul\x00id"},
		{name: "invalid UTF-8 id", id: "bad-\xff\xfe"},
		{name: "malformed traceparent", id: "bad-trace", headers: map[string]string{broker.HeaderTraceParent: "00-zz-\x00-01", broker.HeaderTraceState: "\xff"}},
		{name: "huge header", id: "bad-huge-header", headers: map[string]string{"x-huge": strings.Repeat("h", 32<<10)}},
		{name: "NUL and invalid UTF-8 in a header", id: "bad-header-bytes", headers: map[string]string{"x-odd": "a\x00b\xff"}},
		{name: "empty payload", id: "bad-empty-payload"},
	}
}

// consumeCases runs the consumer over sub until every case is handled or
// dead-lettered and checks each; deadLetters reads the dead-letter
// destination (original id -> reason).
func consumeCases(t *testing.T, cases []msgCase, sub broker.Subscriber, dl broker.Publisher, dlTopic string, idOf func(msgCase) string,
	deadLetters func() map[string]string) {
	t.Helper()
	st, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g, err := idem.NewGuard(st, idem.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var mu sync.Mutex
	runs, traced := map[string]int{}, map[string]bool{}
	c, err := consumer.New(consumer.Config{Subscriber: sub, Guard: g, DeadLetter: dl, Logger: quiet(),
		DeadLetterTopic: func(*broker.Message) string { return dlTopic },
		Handler: func(ctx context.Context, m *broker.Message) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[m.ID]++
			_, traced[m.ID] = broker.TraceFromContext(ctx)
			return nil, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	want := 0
	for _, tc := range cases {
		if !tc.dead {
			want++
		}
	}
	wantDead := len(cases) - want
	var dead map[string]string
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		dead = deadLetters()
		if n >= want && len(dead) >= wantDead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: handled %v, dead-lettered %v", runs, dead)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a duplicate run would show now
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tc := range cases {
		id := idOf(tc)
		if tc.dead {
			reason, ok := dead[id]
			if !ok || !strings.Contains(reason, "key") {
				t.Errorf("%s: dead-lettered %v with reason %q, want a reason about the key", tc.name, ok, reason)
			}
			if runs[id] != 0 {
				t.Errorf("%s: handler ran", tc.name)
			}
			if idem.ValidateKey([]byte(id)) == nil {
				if _, err := st.Get(context.Background(), []byte(id)); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("%s: a record was stored: %v", tc.name, err)
				}
			}
			continue
		}
		if runs[id] != 1 {
			t.Errorf("%s: handler ran %d times, want 1 (runs: %q)", tc.name, runs[id], keys(runs))
		}
		if rec, err := st.Get(context.Background(), []byte(id)); err != nil || rec.State != idem.StateCompleted || string(rec.Key) != id {
			t.Errorf("%s: record %+v, %v", tc.name, rec, err)
		}
		if _, ok := dead[id]; ok {
			t.Errorf("%s: dead-lettered", tc.name)
		}
		if tc.headers[broker.HeaderTraceParent] != "" && traced[id] {
			t.Errorf("%s: an invalid traceparent reached the handler", tc.name)
		}
	}
	// One record per handled message and one per dead letter (the
	// consumer guards each dead-letter publish under "dead-letter:<digest>");
	// none under a rejected message's own key.
	if s, _ := st.Stats(context.Background()); int(s.Total()) != want+wantDead {
		t.Errorf("%d records, want %d handled + %d dead letters", s.Total(), want, wantDead)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestBadInputMessages: the consumer runtime's entry point, over membroker.
func TestBadInputMessages(t *testing.T) {
	b, err := membroker.New(membroker.Config{AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var cases []msgCase
	var msgs []*broker.Message
	for _, tc := range msgCases() {
		m := &broker.Message{ID: tc.id, Topic: "in", Headers: tc.headers, Payload: tc.payload}
		if tc.noID {
			// The publisher is the entry point here: it refuses.
			if err := b.NewPublisher().Publish(context.Background(), m); err == nil || !strings.Contains(err.Error(), "ID") {
				t.Fatalf("publish without an id: %v", err)
			}
			continue
		}
		cases = append(cases, tc)
		msgs = append(msgs, m)
	}
	if err := b.NewPublisher().Publish(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	consumeCases(t, cases, b.NewSubscriber("in", "g"), b.NewPublisher(), "in.dlq", func(tc msgCase) string { return tc.id },
		func() map[string]string {
			out := map[string]string{}
			for _, m := range b.Published("in.dlq") {
				out[m.Headers[consumer.HeaderOriginalID]] = m.Headers[consumer.HeaderDeadLetterReason]
			}
			return out
		})
}

func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// TestBadInputNATSHeaders: raw JetStream messages with bad headers (no id,
// an id over the key limit, NUL and invalid UTF-8 in ids and headers, a
// malformed idem-key and traceparent, a 64 KiB header) through natsbroker.
func TestBadInputNATSHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("nats at %s: %v", natsURL(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("BADINPUT_%d_%d", os.Getpid(), time.Now().UnixNano())
	subj, dlq := "badinput."+name+".in", "badinput."+name+".dlq"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj, dlq}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), name)
	cases := append(msgCases(), msgCase{name: "malformed idem-key", id: "bad-idem-key", headers: map[string]string{natsbroker.HeaderKey: "!!not base64"}})
	for _, tc := range cases {
		m := nats.NewMsg(subj)
		m.Data = tc.payload
		for k, v := range tc.headers {
			m.Header[k] = []string{v}
		}
		if !tc.noID {
			m.Header[broker.HeaderMessageID] = []string{tc.id}
		}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("%s: publish: %v", tc.name, err)
		}
	}
	sub, err := natsbroker.NewSubscriber(ctx, natsbroker.SubscriberConfig{JS: js, Stream: name, Durable: "g", FilterSubject: subj, AckWait: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := natsbroker.NewPublisher(natsbroker.PublisherConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	admin := &brokerAdmin{brokerConn: &brokerConn{kind: "nats", nc: nc, js: js}, bs: BrokerSpec{Kind: "nats", Stream: name, DLQ: dlq}}
	consumeCases(t, cases, sub, pub, dlq, func(tc msgCase) string { return tc.id }, deadReasons(t, admin))
}

// deadReasons reads the dead-letter destination's reasons by original id.
func deadReasons(t *testing.T, a *brokerAdmin) func() map[string]string {
	return func() map[string]string {
		ids, err := a.deadLetterReasons(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
}

// TestBadInputKafkaHeaders: raw Kafka records with bad headers through
// kafkabroker on kfake. A record without an id header gets its
// coordinates as id (kafkabroker's rule for records idem did not
// publish), so it is handled; an empty id header likewise.
func TestBadInputKafkaHeaders(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "dlq"), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	addrs := cl.ListenAddrs()
	kc, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	cases := msgCases()
	for i := range cases {
		if cases[i].noID {
			cases[i].dead = false // handled under its coordinates
		}
	}
	cases = append(cases, msgCase{name: "empty id header", id: "", payload: []byte("empty-id")})
	offsets := map[string]int64{}
	for _, tc := range cases {
		r := &kgo.Record{Topic: "in", Value: tc.payload}
		for k, v := range tc.headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		if !tc.noID {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: broker.HeaderMessageID, Value: []byte(tc.id)})
		}
		res := kc.ProduceSync(ctx, r)
		if err := res.FirstErr(); err != nil {
			t.Fatalf("%s: produce: %v", tc.name, err)
		}
		offsets[tc.name] = res[0].Record.Offset
	}
	sub, err := kafkabroker.NewSubscriber(kafkabroker.SubscriberConfig{Brokers: addrs, Group: "g", Topics: []string{"in"}, SessionTimeout: 2 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := kafkabroker.NewPublisher(kafkabroker.PublisherConfig{Brokers: addrs, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	a, err := newBrokerAdmin(ctx, BrokerSpec{Kind: "kafka", Brokers: addrs, DLQ: "dlq"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	consumeCases(t, cases, sub, pub, "dlq", func(tc msgCase) string {
		if tc.id == "" {
			return fmt.Sprintf("kafka:in:0:%d", offsets[tc.name])
		}
		return tc.id
	}, deadReasons(t, a))
}

// TestBadInputOutbox: Enqueue refuses out-of-range messages before any
// write (the producer's entry point), and the transaction holds nothing.
func TestBadInputOutbox(t *testing.T) {
	ob := memoutbox.New(memoutbox.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		m    outbox.Message
		want string
	}{
		{"empty id and no NewID", outbox.Message{Topic: "t"}, "no ID"},
		{"id over the limit", outbox.Message{ID: strings.Repeat("i", outbox.MaxIDLen+1), Topic: "t"}, "message id"},
		{"empty topic", outbox.Message{ID: "a"}, "topic"},
		{"topic over the limit", outbox.Message{ID: "a", Topic: strings.Repeat("t", outbox.MaxTopicLen+1)}, "topic"},
		{"key over the limit", outbox.Message{ID: "a", Topic: "t", Key: make([]byte, outbox.MaxKeyLen+1)}, "key"},
		{"payload over the limit", outbox.Message{ID: "a", Topic: "t", Payload: make([]byte, outbox.MaxPayloadLen+1)}, "payload"},
		{"headers over the limit", outbox.Message{ID: "a", Topic: "t", Headers: map[string]string{"h": strings.Repeat("v", outbox.MaxHeadersLen)}}, "headers"},
		// The ID and topic are text (pgoutbox stores them in text columns).
		{"NUL in id", outbox.Message{ID: "odd\x00", Topic: "t"}, "NUL or invalid UTF-8"},
		{"invalid UTF-8 id", outbox.Message{ID: "odd\xff", Topic: "t"}, "NUL or invalid UTF-8"},
		{"NUL in topic", outbox.Message{ID: "a", Topic: "t\x00"}, "NUL or invalid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := ob.Begin()
			_, err := tx.Enqueue(ctx, outbox.Message{ID: "fine-" + tc.name, Topic: "t"}, tc.m)
			if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Enqueue = %v, want ErrInvalidArgument about %q", err, tc.want)
			}
			tx.Rollback()
			if st, err := ob.Stats(ctx); err != nil || st.Pending != 0 {
				t.Fatalf("outbox holds %+v after a refused enqueue (%v)", st, err)
			}
		})
	}
	// NUL and invalid UTF-8 in the key, headers and payload are data, kept
	// byte for byte.
	odd := outbox.Message{ID: "odd", Topic: "t", Key: []byte{0, 0xff}, Headers: map[string]string{"h\x00": "\xff\x00"}, Payload: []byte{0}}
	tx := ob.Begin()
	if _, err := tx.Enqueue(ctx, odd); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	b, err := ob.Claim(ctx, outbox.ClaimRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	rows := b.Rows()
	if len(rows) != 1 || rows[0].ID != odd.ID || rows[0].Topic != odd.Topic || string(rows[0].Key) != string(odd.Key) ||
		rows[0].Headers["h\x00"] != "\xff\x00" || string(rows[0].Payload) != "\x00" {
		t.Fatalf("rows %+v", rows)
	}
	_ = b.Release(ctx)
}

// TestBadInputCLI: the harness's own flags (cmd/idem-chaos builds a
// Config from them; Validate is what refuses them).
func TestBadInputCLI(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown scenario", Config{Cells: []Cell{{Scenario: "nope", Store: "pg", Broker: "nats"}}}, "unknown scenario"},
		{"empty scenario", Config{Cells: []Cell{{Scenario: "", Store: "pg", Broker: "nats"}}}, "unknown scenario"},
		{"NUL in store", Config{Cells: []Cell{{Scenario: "kill", Store: "pg\x00", Broker: "nats"}}}, "unknown store"},
		{"invalid UTF-8 broker", Config{Cells: []Cell{{Scenario: "kill", Store: "pg", Broker: "\xff"}}}, "unknown broker"},
		{"negative batch", Config{Cells: []Cell{{Scenario: "kill", Store: "pg", Broker: "nats", Batch: -1}}}, "batch -1 outside"},
		{"huge batch", Config{Cells: []Cell{{Scenario: "kill", Store: "pg", Broker: "nats", Batch: MaxBatch + 1}}}, "batch 1001 outside"},
		{"huge generated batch", Config{Scenarios: []string{"kill"}, Stores: []string{"pg"}, Brokers: []string{"nats"}, Batch: 1 << 20}, "batch 1048576 outside"},
		{"too few messages", Config{Messages: 1}, "messages"},
		{"too many messages", Config{Messages: 10_000_000}, "messages"},
		{"negative duration", Config{Duration: -time.Second}, "duration"},
		{"one consumer", Config{Consumers: 1}, "consumers"},
		{"dup fraction over 1", Config{DupFraction: 1.5}, "dup fraction"},
		{"negative workers", Config{Workers: -1}, "workers"},
		{"too many workers", Config{Workers: 257}, "workers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestBadInputHTTP: the HTTP entry points. The Idempotency-Key middleware
// (the proxy's core) refuses empty, oversized, NUL, non-ASCII and
// malformed keys with 400 before the upstream runs and stores nothing;
// the HTTP service takes any bytes as a key (a NUL through \u0000, any
// byte through key_b64), stores them exactly, and refuses invalid UTF-8
// and malformed bodies with 400 and nothing stored. (httpapi's
// TestBadInputNothingStored and httpidem's tests hold the full tables.)
func TestBadInputHTTP(t *testing.T) {
	mem, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	var upstream atomic.Int64
	mw, err := httpidem.New(httpidem.Config{Store: mem, Logger: quiet(), RequireKey: []string{"/"}})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	proxy := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		upstream.Add(1)
		w.WriteHeader(201)
	})))
	defer proxy.Close()
	for _, tc := range []struct{ name, key string }{
		{"empty", `""`},
		{"blank", " "},
		{"over the key limit", `"` + strings.Repeat("k", idem.MaxKeyLen+1) + `"`},
		{"NUL", "\"a\x00b\""},
		{"bare NUL", "a\x00b"},
		{"invalid UTF-8", "\"a\xff\xfe\""},
		{"bare invalid UTF-8", "a\xffb"},
		{"unterminated", `"abc`},
		{"parameters", `"abc";p=1`},
		{"bad escape", `"a\x"`},
	} {
		t.Run("proxy/"+tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", proxy.URL+"/pay", strings.NewReader("{}"))
			req.Header["Idempotency-Key"] = []string{tc.key}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				// The client refuses to send some bytes (NUL): nothing
				// reached the proxy, which is as good.
				if upstream.Load() != 0 {
					t.Fatal("upstream ran")
				}
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || !strings.Contains(string(body), "key") {
				t.Fatalf("%d %s, want 400 about the key", resp.StatusCode, body)
			}
			if n := upstream.Load(); n != 0 {
				t.Fatalf("upstream ran %d times", n)
			}
			if s, _ := mem.Stats(context.Background()); s.Total() != 0 {
				t.Fatalf("%d records stored", s.Total())
			}
		})
	}

	api, err := httpapi.New(httpapi.Config{Store: mem})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/v1/claim", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name, body string
		code       int
		key        []byte // stored exactly when code is 201
	}{
		{"NUL in key", `{"key":"a\u0000b"}`, 201, []byte("a\x00b")},
		{"any bytes by key_b64", `{"key_b64":"` + base64.StdEncoding.EncodeToString([]byte("\xff\x00\xfe")) + `"}`, 201, []byte("\xff\x00\xfe")},
		{"invalid UTF-8", "{\"key\":\"a\xff\"}", 400, nil},
		{"empty body", ``, 400, nil},
		{"empty key", `{"key":""}`, 400, nil},
		{"key over the limit", `{"key":"` + strings.Repeat("k", idem.MaxKeyLen+1) + `"}`, 400, nil},
		{"malformed", `{"key":`, 400, nil},
	} {
		t.Run("service/"+tc.name, func(t *testing.T) {
			before, _ := mem.Stats(context.Background())
			code, body := post(tc.body)
			if code != tc.code {
				t.Fatalf("%d %s, want %d", code, body, tc.code)
			}
			after, _ := mem.Stats(context.Background())
			if tc.code != 201 {
				if after.Total() != before.Total() || !strings.Contains(body, `"error"`) {
					t.Fatalf("a refused request stored something or said nothing: %s", body)
				}
				return
			}
			if rec, err := mem.Get(context.Background(), tc.key); err != nil || string(rec.Key) != string(tc.key) {
				t.Fatalf("record %q: %+v %v", tc.key, rec, err)
			}
		})
	}
}
