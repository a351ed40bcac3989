package streamsbroker_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/streamsbroker"
	"github.com/redis/go-redis/v9"
)

func TestConfigValidate(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	sub := func(f func(*streamsbroker.SubscriberConfig)) streamsbroker.SubscriberConfig {
		cfg := streamsbroker.SubscriberConfig{Client: c, Stream: "s", Group: "g"}
		f(&cfg)
		return cfg
	}
	for _, tc := range []struct {
		name string
		cfg  interface{ Validate() error }
		ok   bool
	}{
		{"publisher", streamsbroker.PublisherConfig{Client: c}, true},
		{"publisher without client", streamsbroker.PublisherConfig{}, false},
		{"publisher on a ring", streamsbroker.PublisherConfig{Client: ring}, false},
		{"negative dedup window", streamsbroker.PublisherConfig{Client: c, DedupWindow: -1}, false},
		{"dedup window under 1ms", streamsbroker.PublisherConfig{Client: c, DedupWindow: time.Microsecond}, false},
		{"negative MaxLen", streamsbroker.PublisherConfig{Client: c, MaxLen: -1}, false},
		{"subscriber", sub(func(*streamsbroker.SubscriberConfig) {}), true},
		{"no client", sub(func(c *streamsbroker.SubscriberConfig) { c.Client = nil }), false},
		{"ring", sub(func(c *streamsbroker.SubscriberConfig) { c.Client = ring }), false},
		{"no stream", sub(func(c *streamsbroker.SubscriberConfig) { c.Stream = "" }), false},
		{"stream without a usable hash tag", sub(func(c *streamsbroker.SubscriberConfig) { c.Stream = "a{b" }), false},
		{"no group", sub(func(c *streamsbroker.SubscriberConfig) { c.Group = "" }), false},
		{"negative ack wait", sub(func(c *streamsbroker.SubscriberConfig) { c.AckWait = -time.Second }), false},
		{"ack wait under 10ms", sub(func(c *streamsbroker.SubscriberConfig) { c.AckWait = time.Millisecond }), false},
		{"MaxDeliver -1", sub(func(c *streamsbroker.SubscriberConfig) { c.MaxDeliver = -1 }), true},
		{"MaxDeliver -2", sub(func(c *streamsbroker.SubscriberConfig) { c.MaxDeliver = -2 }), false},
		{"trim never", sub(func(c *streamsbroker.SubscriberConfig) { c.TrimInterval = -1 }), true},
		{"trim -2", sub(func(c *streamsbroker.SubscriberConfig) { c.TrimInterval = -2 }), false},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: %v does not wrap idem.ErrInvalidArgument", tc.name, err)
		}
	}
	if _, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: c, Group: "g"}); err == nil {
		t.Error("NewSubscriber accepted a config without a stream")
	}
}

func TestRedeliveryWindow(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tc := range []struct {
		cfg  streamsbroker.SubscriberConfig
		want time.Duration
	}{
		{streamsbroker.SubscriberConfig{}, 20 * 31 * time.Second},
		{streamsbroker.SubscriberConfig{AckWait: time.Minute, MaxDeliver: 5, ClaimInterval: 5 * time.Second}, 5 * 65 * time.Second},
		{streamsbroker.SubscriberConfig{MaxDeliver: -1}, time.Duration(math.MaxInt64)},
	} {
		if got := tc.cfg.RedeliveryWindow(); got != tc.want {
			t.Errorf("%+v: RedeliveryWindow() = %s, want %s", tc.cfg, got, tc.want)
		}
	}
	s, err := streamsbroker.NewSubscriber(streamsbroker.SubscriberConfig{Client: c, Stream: "s", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.RedeliveryWindow() != 620*time.Second || s.MaxDeliveries() != 20 {
		t.Fatalf("defaults: window %s, max deliveries %d", s.RedeliveryWindow(), s.MaxDeliveries())
	}
}
