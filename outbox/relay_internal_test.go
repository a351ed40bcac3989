package outbox

import (
	"context"
	"testing"
)

type listenBackend struct {
	Backend
	on bool
}

func (listenBackend) Listen(context.Context, func()) error { return nil }
func (b listenBackend) Notifies() bool                     { return b.on }

// TestNotifierSwitchedOff: a backend that can notify but has it switched
// off (pgoutbox NotifyOff) is polled at the short interval, not listened to.
func TestNotifierSwitchedOff(t *testing.T) {
	on := Config{Backend: listenBackend{on: true}}.withDefaults()
	off := Config{Backend: listenBackend{on: false}}.withDefaults()
	if on.PollInterval != DefaultNotifyPoll || off.PollInterval != DefaultPollInterval {
		t.Fatalf("poll intervals %s (notifying) and %s (switched off)", on.PollInterval, off.PollInterval)
	}
	if notifierOf(listenBackend{on: false}) != nil || notifierOf(listenBackend{on: true}) == nil {
		t.Fatal("notifierOf ignores Notifies")
	}
}
