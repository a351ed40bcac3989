package rocketbroker

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// TestInProgressRefreshesConsumeStartTime: InProgress moves the message's
// CONSUME_START_TIME (what the client's expired-message cleaner compares
// with ConsumeTimeout) to now while the delivery is unsettled, and not
// after it is settled. The behaviour end to end, with the client's
// cleaner, is TestInProgressRestartsConsumeTimeout (without -race).
func TestInProgressRefreshesConsumeStartTime(t *testing.T) {
	s := &Subscriber{}
	ext := &primitive.MessageExt{}
	old := strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)
	ext.WithProperty(primitive.PropertyConsumeStartTime, old)
	d := &delivery{s: s, ext: ext, done: make(chan struct{})}
	a := &acker{d: d}
	ctx := context.Background()
	if err := a.InProgress(ctx); err != nil {
		t.Fatal(err)
	}
	st, _ := strconv.ParseInt(ext.GetProperty(primitive.PropertyConsumeStartTime), 10, 64)
	if time.Since(time.UnixMilli(st)) > time.Minute {
		t.Fatalf("CONSUME_START_TIME not refreshed: %s", ext.GetProperty(primitive.PropertyConsumeStartTime))
	}
	if err := a.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	ext.WithProperty(primitive.PropertyConsumeStartTime, old)
	if err := a.InProgress(ctx); err != nil || ext.GetProperty(primitive.PropertyConsumeStartTime) != old {
		t.Fatalf("InProgress after Ack: %v, start time %s", err, ext.GetProperty(primitive.PropertyConsumeStartTime))
	}
	d.state = abandoned
	if err := a.InProgress(ctx); err != ErrDeliveryLost {
		t.Fatalf("InProgress on an abandoned delivery: %v", err)
	}
}
