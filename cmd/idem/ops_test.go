package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
)

// cli runs the command line and returns its exit code, stdout and stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// seedBolt makes a bolt file in namespace "ops" holding a key stuck in
// progress (a one-hour lease), a completed key and a key whose bytes are not
// text.
func seedBolt(t *testing.T) (url string, stuck idem.Claim) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ops.db")
	s, err := boltstore.Open(boltstore.Config{Path: path, Namespace: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	claim := func(key string) idem.Claim {
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: []byte(key), Lease: time.Hour, TTL: 24 * time.Hour, Fingerprint: []byte{0xab}})
		if err != nil || c.Outcome != idem.OutcomeAcquired {
			t.Fatalf("claim %q: %v %v", key, c.Outcome, err)
		}
		return c
	}
	stuck = claim("order-1")
	done := claim("order-2")
	if err := s.Complete(ctx, []byte("order-2"), done.Record.Token, []byte(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	claim("\x00bin\xff")
	return "bolt://" + path, stuck
}

func TestOpsCommandsOnBolt(t *testing.T) {
	url, stuck := seedBolt(t)
	g := []string{"--store", url, "--namespace", "ops"}
	with := func(a ...string) []string { return append(append([]string{}, g...), a...) }

	code, out, errs := cli(t, with("inspect", "order-2")...)
	if code != 0 || !strings.Contains(out, "state:        completed") || !strings.Contains(out, `result:       "{\"ok\":true}"`) {
		t.Fatalf("inspect: %d\n%s%s", code, out, errs)
	}
	code, out, _ = cli(t, with("inspect", "--json", "--key-hex", "0062696eff")...)
	var rec recordJSON
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || rec.KeyB64 != "AGJpbv8=" || rec.Key != "" || rec.State != "in_progress" || rec.Fingerprint != "ab" {
		t.Fatalf("inspect --key-hex: %d %s", code, out)
	}
	if code, _, errs = cli(t, with("inspect", "--key-b64", "AGJpbv8=")...); code != 0 {
		t.Fatalf("inspect --key-b64: %d %s", code, errs)
	}

	code, out, _ = cli(t, with("keys", "--state", "in_progress", "--json", "--limit", "1")...)
	var page struct {
		Records    []recordJSON `json:"records"`
		NextCursor string       `json:"next_cursor"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || len(page.Records) != 1 || page.NextCursor == "" {
		t.Fatalf("keys page 1: %d %s", code, out)
	}
	code, out, _ = cli(t, with("keys", "--json", "--limit", "1", "--cursor", page.NextCursor)...)
	var page2 struct {
		Records    []recordJSON `json:"records"`
		NextCursor string       `json:"next_cursor"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &page2) != nil || len(page2.Records) != 1 || page2.Records[0].KeyB64 == page.Records[0].KeyB64 {
		t.Fatalf("keys page 2: %d %s", code, out)
	}

	code, out, _ = cli(t, with("stats", "--json")...)
	var st map[string]int64
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st["in_progress"] != 2 || st["completed"] != 1 || st["total"] != 3 {
		t.Fatalf("stats: %d %s", code, out)
	}

	// Force release: the holder is fenced, the next claim gets a larger token.
	code, out, errs = cli(t, with("release", "order-1", "--cause", "host-7 died", "--json")...)
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || rec.State != "released" || rec.LastError != "host-7 died" || rec.Token != stuck.Record.Token {
		t.Fatalf("release: %d %s %s", code, out, errs)
	}
	code, _, errs = cli(t, with("release", "order-2")...)
	if code != exitConflict || !strings.Contains(errs, "not in progress") {
		t.Fatalf("release of a completed key: %d %s", code, errs)
	}
	s, err := boltstore.Open(boltstore.Config{Path: strings.TrimPrefix(url, "bolt://"), Namespace: "ops"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), []byte("order-1"), stuck.Record.Token, nil); !isErr(err, idem.ErrFenced) {
		t.Fatalf("old holder's Complete after release: %v", err)
	}
	c, err := s.Claim(context.Background(), idem.ClaimRequest{Key: []byte("order-1"), Lease: time.Minute, TTL: time.Hour})
	if err != nil || c.Outcome != idem.OutcomeAcquired || c.Record.Token <= stuck.Record.Token {
		t.Fatalf("claim after release: %+v %v", c, err)
	}
	s.Close()

	if code, out, _ = cli(t, with("evict", "order-2")...); code != 0 || !strings.Contains(out, "evicted") {
		t.Fatalf("evict: %d %s", code, out)
	}
	if code, _, errs = cli(t, with("inspect", "order-2")...); code != exitNotFound {
		t.Fatalf("inspect after evict: %d %s", code, errs)
	}
	if code, out, _ = cli(t, with("gc", "--json")...); code != 0 || !strings.Contains(out, `"purged": 0`) {
		t.Fatalf("gc: %d %s", code, out)
	}
	if code, out, _ = cli(t, with("migrate")...); code != 0 || !strings.Contains(out, "no schema") {
		t.Fatalf("migrate: %d %s", code, out)
	}
	// Another namespace sees none of it.
	if code, _, _ = cli(t, "--store", url, "inspect", "order-1"); code != exitNotFound {
		t.Fatalf("inspect in the default namespace: %d", code)
	}
}

func isErr(err, target error) bool {
	return err != nil && strings.Contains(err.Error(), target.Error())
}

func TestOpsEnvironment(t *testing.T) {
	url, _ := seedBolt(t)
	t.Setenv("IDEM_STORE", url)
	t.Setenv("IDEM_NAMESPACE", "ops")
	if code, out, errs := cli(t, "inspect", "order-1"); code != 0 || !strings.Contains(out, "in_progress") {
		t.Fatalf("inspect from the environment: %d %s %s", code, out, errs)
	}
	// A flag beats the environment.
	if code, _, _ := cli(t, "--namespace", "other", "inspect", "order-1"); code != exitNotFound {
		t.Fatalf("--namespace over $IDEM_NAMESPACE: %d", code)
	}
	t.Setenv("IDEM_TIMEOUT", "soon")
	if code, _, errs := cli(t, "inspect", "order-1"); code != exitUsage || !strings.Contains(errs, "$IDEM_TIMEOUT") {
		t.Fatalf("bad $IDEM_TIMEOUT: %d %s", code, errs)
	}
}

func TestOpsErrors(t *testing.T) {
	url, _ := seedBolt(t)
	missing := "bolt://" + filepath.Join(t.TempDir(), "none.db")
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--store", url, "inspect"}, exitUsage, "give the key once"},
		{[]string{"--store", url, "inspect", "a", "--key-hex", "00"}, exitUsage, "give the key once"},
		{[]string{"--store", url, "inspect", "--key-hex", "zz"}, exitUsage, "--key-hex"},
		{[]string{"--store", url, "inspect", "--key-b64", "!!"}, exitUsage, "--key-b64"},
		{[]string{"--store", url, "inspect", strings.Repeat("k", 2000)}, exitUsage, "invalid key"},
		{[]string{"--store", url, "--namespace", "bad ns", "inspect", "k"}, exitUsage, "--namespace"},
		{[]string{"--store", url, "keys", "--state", "completed"}, exitUsage, "only \"in_progress\""},
		{[]string{"--store", url, "keys", "--limit", "0"}, exitUsage, "--limit"},
		{[]string{"--store", url, "keys", "extra"}, exitUsage, "unknown command"},
		{[]string{"--store", url, "release", "k", "--cause", strings.Repeat("c", 5000)}, exitUsage, "--cause"},
		{[]string{"--store", url, "inspect", "nope"}, exitNotFound, "not found"},
		{[]string{"--store", missing, "inspect", "k"}, exitUnavailable, "no such file"},
		{[]string{"--store", "nope://x", "inspect", "k"}, exitUsage, `unknown scheme "nope"`},
		{[]string{"--store", "idem.db", "inspect", "k"}, exitUsage, "not a URL"},
		{[]string{"--store", "bolt://idem.db", "inspect", "k"}, exitUsage, "has host"},
		{[]string{"--store", "bolt:x.db?fsync=sometimes", "inspect", "k"}, exitUsage, "fsync"},
		{[]string{"--store", url, "inspect", "k", "--timeout", "x"}, exitUsage, "--timeout"},
		{[]string{"id", "parse", "-5"}, exitUsage, "unknown shorthand flag"},
		{[]string{"id", "parse", "x1"}, exitUsage, "not an id"},
		{[]string{"id", "new", "--worker", "5000"}, exitUsage, "--worker"},
		{[]string{"id", "new", "--time-bits", "10"}, exitUsage, "must add up to 63"},
	} {
		code, _, errs := cli(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("%q: exit %d, stderr %q; want %d containing %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
}

func TestID(t *testing.T) {
	code, out, _ := cli(t, "id", "new", "--count", "3", "--worker", "7")
	ids := strings.Fields(out)
	if code != 0 || len(ids) != 3 || !(ids[0] < ids[1] && ids[1] < ids[2]) {
		t.Fatalf("id new: %d %q", code, out)
	}
	code, out, _ = cli(t, "id", "parse", ids[0], "--json")
	var parsed []struct {
		Worker int64     `json:"worker"`
		Time   time.Time `json:"time"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &parsed) != nil || parsed[0].Worker != 7 || time.Since(parsed[0].Time) > time.Minute {
		t.Fatalf("id parse: %d %s", code, out)
	}
	// A fixed id of the default layout: 2020-01-01 + 1000 ms, worker 3, sequence 5.
	code, out, _ = cli(t, "id", "parse", "4194316293")
	if code != 0 || !strings.Contains(out, "time 2020-01-01T00:00:01Z\tworker 3\tsequence 5") {
		t.Fatalf("id parse fixed: %d %q", code, out)
	}
}

func TestErrorsAsJSON(t *testing.T) {
	code, out, errs := cli(t, "--store", "bolt:"+filepath.Join(t.TempDir(), "none.db"), "--json", "inspect", "k")
	var e struct {
		Error string `json:"error"`
		Exit  int    `json:"exit"`
	}
	if code != exitUnavailable || out != "" || json.Unmarshal([]byte(errs), &e) != nil || e.Exit != exitUnavailable || !strings.Contains(e.Error, "no such file") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
