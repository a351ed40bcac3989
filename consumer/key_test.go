package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/broker"
	"github.com/idem-dev/idem/consumer"
)

func TestKeyFuncs(t *testing.T) {
	m := func(id, payload string) *broker.Message { return &broker.Message{ID: id, Payload: []byte(payload)} }
	for _, tc := range []struct {
		name    string
		key     consumer.KeyFunc
		m       *broker.Message
		want    string // "" with wantErr
		wantErr bool
	}{
		{"message id", consumer.MessageIDKey, m("abc", ""), "abc", false},
		{"empty message id", consumer.MessageIDKey, m("", "x"), "", true},
		{"business key", consumer.JSONBusinessKey("order.id", "op"), m("", `{"order":{"id":"o-1"},"op":"pay"}`), "pay:o-1", false},
		{"business key numeric id", consumer.JSONBusinessKey("id", "op"), m("", `{"id":42,"op":"refund"}`), "refund:42", false},
		{"business key missing op", consumer.JSONBusinessKey("id", "op"), m("", `{"id":42}`), "", true},
		{"business key null id", consumer.JSONBusinessKey("id", "op"), m("", `{"id":null,"op":"x"}`), "", true},
		{"business key op with colon", consumer.JSONBusinessKey("id", "op"), m("", `{"id":1,"op":"a:b"}`), "", true},
		{"not json", consumer.JSONBusinessKey("id", "op"), m("", `nope`), "", true},
		{"path through a scalar", consumer.JSONBusinessKey("id.x", "op"), m("", `{"id":1,"op":"a"}`), "", true},
		{"fields missing", consumer.JSONFieldsKey("a", "b"), m("", `{"a":1}`), "", true},
		{"no fields", consumer.JSONFieldsKey(), m("", `{"a":1}`), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := tc.key(tc.m)
			if tc.wantErr {
				if !errors.Is(err, consumer.ErrNoKey) {
					t.Fatalf("err = %v, want ErrNoKey", err)
				}
				return
			}
			if err != nil || string(k) != tc.want {
				t.Fatalf("key %q, err %v; want %q", k, err, tc.want)
			}
		})
	}
}

func TestJSONFieldsKeyIgnoresOtherFields(t *testing.T) {
	k := consumer.JSONFieldsKey("account", "amount")
	a, err1 := k(&broker.Message{Payload: []byte(`{"account":"x","amount":10,"ts":1}`)})
	b, err2 := k(&broker.Message{Payload: []byte(`{"ts":2, "amount":10, "account":"x"}`)})
	c, err3 := k(&broker.Message{Payload: []byte(`{"account":"x","amount":11}`)})
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	if string(a) != string(b) || string(a) == string(c) {
		t.Fatalf("keys %s %s %s", a, b, c)
	}
	if err := idem.ValidateKey(a); err != nil {
		t.Fatal(err)
	}
}

func TestFingerprints(t *testing.T) {
	m1 := &broker.Message{Payload: []byte(`{"a":1,"ts":1}`)}
	m2 := &broker.Message{Payload: []byte(`{"a":1,"ts":2}`)}
	if string(consumer.PayloadFingerprint(m1)) == string(consumer.PayloadFingerprint(m2)) {
		t.Fatal("different payloads, same fingerprint")
	}
	f := consumer.JSONFieldsFingerprint("a")
	if string(f(m1)) != string(f(m2)) || len(f(m1)) > idem.MaxFingerprintLen {
		t.Fatal("field fingerprint differs on an ignored field")
	}
	if consumer.NoFingerprint(m1) != nil {
		t.Fatal("NoFingerprint returned one")
	}
}

func FuzzJSONKeys(f *testing.F) {
	for _, s := range []string{`{"id":1,"op":"x"}`, `{"id":{"a":[1,2]},"op":"y"}`, `[]`, `null`, `{"id":"\u0000","op":"z"}`, ``} {
		f.Add([]byte(s))
	}
	bk := consumer.JSONBusinessKey("id", "op")
	fk := consumer.JSONFieldsKey("id", "op")
	f.Fuzz(func(t *testing.T, payload []byte) {
		m := &broker.Message{Payload: payload}
		for _, kf := range []consumer.KeyFunc{bk, fk} {
			k, err := kf(m)
			if err != nil {
				if !errors.Is(err, consumer.ErrNoKey) {
					t.Fatalf("error not ErrNoKey: %v", err)
				}
				continue
			}
			if len(k) == 0 {
				t.Fatal("empty key without an error")
			}
		}
		_ = consumer.JSONFieldsFingerprint("id")(m)
	})
}

func TestConfigValidate(t *testing.T) {
	e := newEnv(t)
	ok := e.config(e.sub("g"))
	ok.Handler = func(_ context.Context, _ *broker.Message) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		mut  func(*consumer.Config)
		ok   bool
	}{
		{"ok", func(*consumer.Config) {}, true},
		{"no subscriber", func(c *consumer.Config) { c.Subscriber = nil }, false},
		{"no guard", func(c *consumer.Config) { c.Guard = nil }, false},
		{"no handler", func(c *consumer.Config) { c.Handler = nil }, false},
		{"both handlers", func(c *consumer.Config) {
			c.BatchHandler = func(context.Context, []*broker.Message) error { return nil }
		}, false},
		{"negative workers", func(c *consumer.Config) { c.Workers = -1 }, false},
		{"negative delay", func(c *consumer.Config) { c.StoreDownDelay = -time.Second }, false},
		{"bad multiplier", func(c *consumer.Config) { c.Backoff.Multiplier = 0.5 }, false},
		{"initial over max", func(c *consumer.Config) { c.Backoff = consumer.Backoff{Initial: time.Minute, Max: time.Second} }, false},
		{"bad policy", func(c *consumer.Config) { c.MissingKey = 9 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.mut(&cfg)
			err := cfg.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if _, nerr := consumer.New(cfg); (nerr == nil) != tc.ok {
				t.Fatalf("New() = %v, want ok=%v", nerr, tc.ok)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	b := consumer.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2}
	for n, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second} {
		if got := b.Delay(n); got != want {
			t.Fatalf("Delay(%d) = %s, want %s", n, got, want)
		}
	}
	if got := b.Delay(1000); got != time.Second {
		t.Fatalf("Delay(1000) = %s", got)
	}
}
