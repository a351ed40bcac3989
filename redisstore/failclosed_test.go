package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/redistest"
	"github.com/idem-dev/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

func ownClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
		DialerRetries: 1, DialerRetryTimeout: 10 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

func mustNew(t testing.TB, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func claimReq(key string) idem.ClaimRequest {
	return idem.ClaimRequest{Key: []byte(key), Lease: time.Minute, TTL: time.Hour}
}

// TestFailClosedAndRecover stops a dedicated redis-server (SIGKILL) under a
// store, checks that every operation fails with ErrUnavailable or
// ErrUnknownOutcome (never success), restarts it and checks that the store
// recovers with the record intact (appendfsync always) and tokens still
// growing.
func TestFailClosedAndRecover(t *testing.T) {
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	s := mustNew(t, redisstore.Config{Client: ownClient(t, srv.Addr())})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c1, err := s.Claim(ctx, claimReq("k1"))
	if err != nil || c1.Outcome != idem.OutcomeAcquired {
		t.Fatalf("Claim: %v %v", c1.Outcome, err)
	}

	srv.Stop()
	tok := c1.Record.Token
	ops := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"Claim", func(ctx context.Context) error { _, err := s.Claim(ctx, claimReq("k2")); return err }},
		{"ClaimBatch", func(ctx context.Context) error {
			_, err := s.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("k3"), claimReq("k4")})
			return err
		}},
		{"Complete", func(ctx context.Context) error { return s.Complete(ctx, []byte("k1"), tok, []byte("r")) }},
		{"CompleteBatch", func(ctx context.Context) error {
			_, err := s.CompleteBatch(ctx, []idem.Completion{{Key: []byte("k1"), Token: tok}, {Key: []byte("k5"), Token: 1}})
			return err
		}},
		{"Release", func(ctx context.Context) error { return s.Release(ctx, []byte("k1"), tok, "") }},
		{"Fail", func(ctx context.Context) error { return s.Fail(ctx, []byte("k1"), tok, "x") }},
		{"Extend", func(ctx context.Context) error { return s.Extend(ctx, []byte("k1"), tok, time.Minute) }},
		{"Get", func(ctx context.Context) error { _, err := s.Get(ctx, []byte("k1")); return err }},
		{"Delete", func(ctx context.Context) error { return s.Delete(ctx, []byte("k9")) }},
		{"Ping", s.Ping},
		{"ListInProgress", func(ctx context.Context) error { _, _, err := s.ListInProgress(ctx, "", 10); return err }},
		{"Stats", func(ctx context.Context) error { _, err := s.Stats(ctx); return err }},
	}
	for _, op := range ops {
		// Twice: the first call may find a pooled connection that is dead,
		// the second has to dial.
		for i := range 2 {
			err := op.fn(ctx)
			if err == nil {
				t.Fatalf("%s #%d succeeded with Redis down", op.name, i)
			}
			if !errors.Is(err, idem.ErrUnavailable) && !errors.Is(err, idem.ErrUnknownOutcome) {
				t.Fatalf("%s #%d: %v, want ErrUnavailable or ErrUnknownOutcome", op.name, i, err)
			}
		}
	}
	// With nobody listening the connection is refused: nothing was sent.
	if _, err := s.Claim(ctx, claimReq("k2")); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("Claim with the server down: %v, want ErrUnavailable", err)
	}

	srv.Start()
	var rec idem.Record
	for i := 0; ; i++ {
		rec, err = s.Get(ctx, []byte("k1"))
		if err == nil {
			break
		}
		if i > 50 {
			t.Fatalf("store did not recover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rec.State != idem.StateInProgress || rec.Token != tok {
		t.Fatalf("record after restart %+v, want in progress with token %d", rec, tok)
	}
	if err := s.Complete(ctx, []byte("k1"), tok, []byte("done")); err != nil {
		t.Fatalf("Complete after restart: %v", err)
	}
	c2, err := s.Claim(ctx, claimReq("k2"))
	if err != nil || c2.Outcome != idem.OutcomeAcquired {
		t.Fatalf("Claim after restart: %v %v", c2.Outcome, err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after restart: %v", err)
	}
}

// TestReplicaSafety covers WAIT and READONLY with a master and a replica the
// test starts: writes on a replica are ErrUnavailable; WaitReplicas succeeds
// while the replica acknowledges and reports ErrUnknownOutcome once it is
// gone.
func TestReplicaSafety(t *testing.T) {
	master := redistest.StartServer(t, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", master.Addr()[len("127.0.0.1:"):])
	mc, rc := ownClient(t, master.Addr()), ownClient(t, replica.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; ; i++ {
		info, _ := rc.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if i > 800 {
			t.Fatalf("replica did not sync: %s", info)
		}
		time.Sleep(25 * time.Millisecond)
	}

	// The replica reports its link up before the master counts it online
	// and receives its acks: wait until a WAIT on the master is answered.
	for i := 0; ; i++ {
		n, err := mc.Wait(ctx, 1, 500*time.Millisecond).Result()
		if err == nil && n >= 1 {
			break
		}
		if i > 100 {
			t.Fatalf("master never saw the replica acknowledge: %v %v", n, err)
		}
	}

	onReplica := mustNew(t, redisstore.Config{Client: rc})
	if _, err := onReplica.Claim(ctx, claimReq("r")); !errors.Is(err, idem.ErrUnavailable) {
		t.Fatalf("Claim on a read-only replica: %v, want ErrUnavailable", err)
	}

	// WAIT may block up to WaitTimeout, so the client must read for longer.
	if _, err := redisstore.New(ctx, redisstore.Config{Client: mc, WaitReplicas: 1, WaitTimeout: 2 * time.Second}); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("New with WaitTimeout beyond the client's ReadTimeout: %v, want ErrInvalidArgument", err)
	}
	// A replica's first acknowledgement after its sync can take about a
	// second: give WAIT room, and the client longer still.
	wc := redis.NewClient(&redis.Options{Addr: master.Addr(), MaxRetries: -1, ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { wc.Close() })
	waiting := mustNew(t, redisstore.Config{Client: wc, WaitReplicas: 1, WaitTimeout: 3 * time.Second})
	c, err := waiting.Claim(ctx, claimReq("w1"))
	if err != nil || c.Outcome != idem.OutcomeAcquired {
		t.Fatalf("Claim with WAIT 1 and a live replica: %v %v", c.Outcome, err)
	}
	if err := waiting.Complete(ctx, []byte("w1"), c.Record.Token, nil); err != nil {
		t.Fatalf("Complete with WAIT: %v", err)
	}
	if _, err := waiting.ClaimBatch(ctx, []idem.ClaimRequest{claimReq("w2"), claimReq("w3")}); err != nil {
		t.Fatalf("ClaimBatch with WAIT: %v", err)
	}
	// The replica saw the claim: failover would keep it.
	if r, err := onReplica.Get(ctx, []byte("w1")); err != nil || r.State != idem.StateCompleted {
		t.Fatalf("replica's copy of w1: %+v %v", r, err)
	}

	replica.Stop()
	short := mustNew(t, redisstore.Config{Client: mc, WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	_, err = short.Claim(ctx, claimReq("w4"))
	if !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("Claim with WAIT 1 and no replica: %v, want ErrUnknownOutcome", err)
	}
	// Unknown means "read before deciding": the claim is on the master.
	if r, err := short.Get(ctx, []byte("w4")); err != nil || r.State != idem.StateInProgress {
		t.Fatalf("w4 on the master: %+v %v", r, err)
	}
}

// TestEvictionWarning checks the startup warning about maxmemory-policy.
func TestEvictionWarning(t *testing.T) {
	tests := []struct {
		policy string
		warn   bool
	}{{"noeviction", false}, {"allkeys-lru", true}, {"volatile-ttl", true}}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			srv := redistest.StartServer(t, "--maxmemory-policy", tc.policy)
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			mustNew(t, redisstore.Config{Client: ownClient(t, srv.Addr()), Logger: log})
			if got := strings.Contains(buf.String(), "maxmemory-policy is not noeviction"); got != tc.warn {
				t.Fatalf("warning logged = %v, want %v; log: %s", got, tc.warn, buf.String())
			}
		})
	}
}

// TestClusterNodeDown kills one master of a 3-master cluster: a batch that
// spans every node must fail as a whole (ErrUnknownOutcome when the other
// nodes applied their part, ErrUnavailable when none did), never report
// success; after the node restarts the store works again.
func TestClusterNodeDown(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, DialerRetries: 1, DialerRetryTimeout: 10 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	s := mustNew(t, redisstore.Config{Client: c})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	batch := func(tag string) []idem.ClaimRequest {
		var reqs []idem.ClaimRequest
		for i := range 64 { // 64 keys land on every master with near certainty
			reqs = append(reqs, claimReq(tag+strconv.Itoa(i)))
		}
		return reqs
	}
	before, err := s.ClaimBatch(ctx, batch("before-"))
	if err != nil {
		t.Fatalf("ClaimBatch with all nodes up: %v", err)
	}
	// Completing them also loads the script on every master: a first
	// EVALSHA that finds no script runs nothing, so the batch below would
	// be ErrUnavailable (correctly: nothing applied) rather than partial.
	var done []idem.Completion
	for _, r := range before {
		done = append(done, idem.Completion{Key: r.Claim.Record.Key, Token: r.Claim.Record.Token})
	}
	if errs, err := s.CompleteBatch(ctx, done); err != nil || slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		t.Fatalf("CompleteBatch with all nodes up: %v %v", errs, err)
	}
	held, err := s.ClaimBatch(ctx, batch("held-"))
	if err != nil {
		t.Fatalf("ClaimBatch with all nodes up: %v", err)
	}
	var cs []idem.Completion
	for _, r := range held {
		cs = append(cs, idem.Completion{Key: r.Claim.Record.Key, Token: r.Claim.Record.Token, Result: []byte("done")})
	}
	cl.Nodes[1].Stop()
	// The other masters complete their share: the call is partly applied.
	if _, err := s.CompleteBatch(ctx, cs); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("CompleteBatch with a master down: %v, want ErrUnknownOutcome", err)
	}
	for i := range 3 {
		res, err := s.ClaimBatch(ctx, batch("down-"+strconv.Itoa(i)+"-"))
		if err == nil {
			t.Fatalf("ClaimBatch with a master down succeeded: %d results", len(res))
		}
		if !errors.Is(err, idem.ErrUnknownOutcome) && !errors.Is(err, idem.ErrUnavailable) {
			t.Fatalf("ClaimBatch with a master down: %v", err)
		}
	}
	cl.Nodes[1].Start()
	for i := 0; ; i++ {
		_, err := s.ClaimBatch(ctx, batch("after-"+strconv.Itoa(i)+"-"))
		if err == nil {
			break
		}
		if i > 200 {
			t.Fatalf("cluster store did not recover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Retrying the partly applied batch is safe: entries already applied
	// succeed again. The restarted master kept no data (no persistence), so
	// its entries are ErrNotFound.
	errs, err := s.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatalf("CompleteBatch retry after recovery: %v", err)
	}
	ok := 0
	for i, e := range errs {
		if errors.Is(e, idem.ErrNotFound) {
			continue
		}
		if e != nil {
			t.Fatalf("retry entry %d: %v", i, e)
		}
		ok++
		if rec, err := s.Get(ctx, cs[i].Key); err != nil || rec.State != idem.StateCompleted || string(rec.Result) != "done" {
			t.Fatalf("%s after retry: %+v %v", cs[i].Key, rec, err)
		}
	}
	if ok == 0 {
		t.Fatal("no entry of the retried batch succeeded")
	}
}

// TestClusterWait runs WaitReplicas on a cluster of 3 masters with one
// replica each: writes succeed while the replicas acknowledge; with one
// replica killed, a batch touching its master reports ErrUnknownOutcome.
func TestClusterWait(t *testing.T) {
	cl := redistest.StartClusterReplicas(t, 3, 1)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()[:3], MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s := mustNew(t, redisstore.Config{Client: c, WaitReplicas: 1, WaitTimeout: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl1, err := s.Claim(ctx, claimReq("one"))
	if err != nil || cl1.Outcome != idem.OutcomeAcquired {
		t.Fatalf("Claim with WAIT on the cluster: %v %v", cl1.Outcome, err)
	}
	if err := s.Complete(ctx, []byte("one"), cl1.Record.Token, []byte("r")); err != nil {
		t.Fatalf("Complete with WAIT: %v", err)
	}
	var reqs []idem.ClaimRequest
	for i := range 64 {
		reqs = append(reqs, claimReq("b"+strconv.Itoa(i)), claimReq("b"+strconv.Itoa(i)))
	}
	res, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatalf("ClaimBatch with WAIT: %v", err)
	}
	for i := 0; i < len(res); i += 2 {
		if res[i].Claim.Outcome != idem.OutcomeAcquired || res[i+1].Claim.Outcome != idem.OutcomeInProgress {
			t.Fatalf("entries %d,%d: %v %v", i, i+1, res[i].Claim.Outcome, res[i+1].Claim.Outcome)
		}
	}

	// Kill one replica: its master cannot get an acknowledgement.
	var victim *redistest.Server
	for _, n := range cl.Nodes {
		nc := redis.NewClient(&redis.Options{Addr: n.Addr()})
		info, _ := nc.Info(ctx, "replication").Result()
		nc.Close()
		if strings.Contains(info, "role:slave") {
			victim = n
			break
		}
	}
	if victim == nil {
		t.Fatal("no replica found")
	}
	victim.Stop()
	short := mustNew(t, redisstore.Config{Client: c, WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	reqs = reqs[:0]
	for i := range 64 {
		reqs = append(reqs, claimReq("w"+strconv.Itoa(i)))
	}
	if _, err := short.ClaimBatch(ctx, reqs); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("ClaimBatch with a replica down: %v, want ErrUnknownOutcome", err)
	}
	var cs []idem.Completion
	for i := 0; i < len(res); i += 2 {
		cs = append(cs, idem.Completion{Key: res[i].Claim.Record.Key, Token: res[i].Claim.Record.Token})
	}
	if _, err := short.CompleteBatch(ctx, cs); !errors.Is(err, idem.ErrUnknownOutcome) {
		t.Fatalf("CompleteBatch with a replica down: %v, want ErrUnknownOutcome", err)
	}
}
