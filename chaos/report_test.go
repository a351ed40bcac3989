package chaos

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	rs := []Result{
		{Cell: Cell{Scenario: "kill", Store: "pg", Broker: "nats"}, Messages: 100, Injected: 2, Hit: 2, DupDeliveries: 7, MsgsPerSec: 12.5, Pass: true,
			Faults: []Fault{{Kind: "sigkill", Target: "consumer-0", Hit: true, Evidence: "held 3"}}},
		{Cell: Cell{Scenario: "outage", Store: "redis", Broker: "nats"}, Messages: 100, Injected: 1, Lost: 1, Problems: []string{"1 messages lost"}},
		{Cell: Cell{Scenario: "stall", Store: "bolt", Broker: "kafka", Batch: 50}, Messages: 100, Pass: true,
			Faults: []Fault{{Kind: "sigstop", Target: "consumer-1", Hit: true, Evidence: "held 50"}}},
	}
	var tb bytes.Buffer
	if err := WriteTable(&tb, rs); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"batch", "stall / bolt / kafka / batch50 (seed", "dup deliveries", "dup effects", "lost", "msgs/s", "unrecorded (reruns)", "reruns after lost claim", "FAIL", "pass", "total", "held 3", "problem: 1 messages lost"} {
		if !strings.Contains(tb.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, tb.String())
		}
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, rs); err != nil {
		t.Fatal(err)
	}
	var back []map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"scenario", "store", "broker", "messages", "faults", "faults_injected", "faults_hit",
		"duplicate_deliveries", "duplicate_effects", "lost", "msgs_per_sec", "pass", "unrecorded", "reruns_after_unrecorded", "reruns_after_lost_claim"} {
		if _, ok := back[0][f]; !ok {
			t.Fatalf("JSON lacks %q: %s", f, js.String())
		}
	}
	if back[1]["pass"] != false || back[1]["lost"] != float64(1) {
		t.Fatalf("second result %v", back[1])
	}
	if !strings.HasPrefix(rs[1].Line(), "FAIL outage/redis/nats:") {
		t.Fatal(rs[1].Line())
	}
	if !strings.HasPrefix(rs[2].Line(), "PASS stall/bolt/kafka/batch50:") || back[2]["batch"] != float64(50) {
		t.Fatalf("%s; %v", rs[2].Line(), back[2])
	}
	if _, ok := back[0]["batch"]; ok {
		t.Fatalf("a single-mode cell's JSON has a batch: %v", back[0])
	}
}

// TestParseCell: -cells reads what Cell.String writes; a fourth part
// other than batchN (N > 0) is refused.
func TestParseCell(t *testing.T) {
	for _, c := range []Cell{{Scenario: "kill", Store: "pg", Broker: "nats"}, {Scenario: "stall", Store: "bolt", Broker: "kafka", Batch: 50}} {
		got, err := ParseCell(c.String())
		if err != nil || got != c {
			t.Fatalf("ParseCell(%q) = %+v, %v", c.String(), got, err)
		}
	}
	for _, bad := range []string{"kill/pg", "kill/pg/nats/50", "kill/pg/nats/batch", "kill/pg/nats/batch0", "kill/pg/nats/batch-3", "kill/pg/nats/batch5/x", "kill/pg/nats/xbatch5"} {
		if c, err := ParseCell(bad); err == nil {
			t.Fatalf("ParseCell(%q) = %+v, want an error", bad, c)
		}
	}
}
