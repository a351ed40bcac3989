package mysqlstore_test

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// cutProxy forwards TCP to the server and, when armed, cuts a connection at
// the client's first command that match accepts (by default COMMIT): either
// before forwarding it (the server never runs it) or after forwarding it and
// swallowing the server's reply (the server runs it, the client never
// hears). It counts the matching commands that reached it (seen).
type cutProxy struct {
	ln     net.Listener
	target string
	match  func(body []byte) bool // body: command byte + payload
	mode   atomic.Int32           // 0 off, 1 cut before, 2 cut after
	cuts   atomic.Int32
	seen   atomic.Int32
	// hold, when set, runs before any client command is forwarded (the
	// client waits): a test's chance to act between two statements.
	hold  atomic.Pointer[func(body []byte)]
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

// storeAt migrates the default config in database name and opens a store
// on a pool of its own that reaches the server at addr (a proxy's), with
// extra DSN params; cleanup closes both.
func storeAt(t *testing.T, addr, name string, params map[string]string) *mysqlstore.Store {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn(addr, name))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = params
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := testCtx(t)
	if err := mysqlstore.Migrate(ctx, mysqlstore.Config{DB: db}); err != nil {
		t.Fatal(err)
	}
	s, err := mysqlstore.Open(ctx, mysqlstore.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func isCommit(body []byte) bool {
	return len(body) == 7 && body[0] == 0x03 && string(body[1:]) == "COMMIT"
}

// closeAll closes every connection open through the proxy (the server
// side too), as a server restart or a network cut between calls would.
func (p *cutProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

const (
	cutOff = iota
	cutBefore
	cutAfter
)

func newCutProxy(t *testing.T, target string) *cutProxy {
	return newCutProxyAt(t, target, isCommit)
}

func newCutProxyAt(t *testing.T, target string, match func([]byte) bool) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, match: match}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var mute atomic.Bool
		p.wg.Go(func() { // server -> client
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && !mute.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			c.Close()
		})
		p.wg.Go(func() { // client -> server, packet by packet
			defer s.Close()
			defer c.Close()
			hdr := make([]byte, 4)
			for {
				if _, err := io.ReadFull(c, hdr); err != nil {
					return
				}
				n := int(hdr[0]) | int(hdr[1])<<8 | int(hdr[2])<<16
				body := make([]byte, n)
				if _, err := io.ReadFull(c, body); err != nil {
					return
				}
				if h := p.hold.Load(); h != nil {
					(*h)(body)
				}
				if p.match(body) {
					p.seen.Add(1)
					switch {
					case p.mode.CompareAndSwap(cutBefore, cutOff):
						p.cuts.Add(1)
						return
					case p.mode.CompareAndSwap(cutAfter, cutOff):
						p.cuts.Add(1)
						mute.Store(true)
						s.Write(append(hdr, body...))
						time.Sleep(200 * time.Millisecond) // let the server run it
						return
					}
				}
				if _, err := s.Write(append(hdr, body...)); err != nil {
					return
				}
			}
		})
	}
}

// Connection lost during COMMIT: DoTx reads the record back to learn what
// happened instead of guessing.
func TestDoTxCommitLost(t *testing.T) {
	name, direct := newDB(t)
	makeLedger(t, direct)
	proxy := newCutProxy(t, serverAddr())
	s := storeAt(t, proxy.ln.Addr().String(), name, nil)
	ctx := testCtx(t)

	t.Run("cut before commit: rolled back", func(t *testing.T) {
		proxy.mode.Store(cutBefore)
		_, err := s.DoTx(ctx, claimReq("before"), appendLedger("before", "r"))
		if proxy.cuts.Load() != 1 {
			t.Fatalf("proxy did not cut (err %v)", err)
		}
		if !errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
			t.Fatalf("err = %v, want ErrUnavailable (resolved: not committed)", err)
		}
		if n := ledgerCount(t, direct, "before"); n != 0 {
			t.Fatalf("ledger %d", n)
		}
		c, err := s.DoTx(ctx, claimReq("before"), appendLedger("before", "r2"))
		if err != nil || c.Outcome != idem.OutcomeAcquired || ledgerCount(t, direct, "before") != 1 {
			t.Fatalf("retry = %+v, %v", c, err)
		}
	})
	t.Run("cut after commit: committed", func(t *testing.T) {
		proxy.mode.Store(cutAfter)
		c, err := s.DoTx(ctx, claimReq("after"), appendLedger("after", "r"))
		if proxy.cuts.Load() != 2 {
			t.Fatalf("proxy did not cut (err %v)", err)
		}
		if err != nil || c.Outcome != idem.OutcomeAcquired || c.Record.State != idem.StateCompleted || string(c.Record.Result) != "r" {
			t.Fatalf("DoTx = %+v, %v; want acquired and completed (resolved by reading the record)", c, err)
		}
		if n := ledgerCount(t, direct, "after"); n != 1 {
			t.Fatalf("ledger %d", n)
		}
		c, err = s.DoTx(ctx, claimReq("after"), appendLedger("after", "again"))
		if err != nil || c.Outcome != idem.OutcomeCompleted || ledgerCount(t, direct, "after") != 1 {
			t.Fatalf("duplicate = %+v, %v", c, err)
		}
	})
}

// A claim whose reply is lost (the connection breaks after the statement
// reached the server, or after the client wrote it but before the server
// got it) is never sent again by database/sql or the driver: the caller
// gets ErrUnknownOutcome, and the proxy saw the statement once. A
// connection that broke while idle is noticed before anything is written
// (the driver's liveness check, then database/sql's ErrBadConn retry on a
// new connection): that claim is sent once and succeeds. Run with the DSN
// options that change how statements are sent or retried.
func TestClaimReplyLostNotResent(t *testing.T) {
	for name, params := range map[string]map[string]string{
		"default":                          nil,
		"interpolateParams+rejectReadOnly": {"interpolateParams": "true", "rejectReadOnly": "true"},
		"no liveness check":                {"checkConnLiveness": "false"},
	} {
		t.Run(name, func(t *testing.T) {
			dbName, _ := newDB(t)
			isClaim := func(b []byte) bool {
				return len(b) > 1 && b[0] == 0x03 && bytes.Contains(b, []byte("INTO `idem_records`")) && bytes.Contains(b, []byte("INSERT"))
			}
			proxy := newCutProxyAt(t, serverAddr(), isClaim)
			s := storeAt(t, proxy.ln.Addr().String(), dbName, params)
			check := storeAt(t, serverAddr(), dbName, nil)
			ctx := testCtx(t)

			for _, mode := range []int32{cutAfter, cutBefore} {
				key := fmt.Sprintf("lost-%d", mode)
				seen := proxy.seen.Load()
				proxy.mode.Store(mode)
				_, err := s.Claim(ctx, claimReq(key))
				if proxy.cuts.Load() == 0 || proxy.mode.Load() != cutOff {
					t.Fatalf("mode %d: the proxy did not cut (err %v)", mode, err)
				}
				proxy.cuts.Store(0)
				if !errors.Is(err, idem.ErrUnknownOutcome) {
					t.Fatalf("mode %d: Claim with its reply lost = %v, want ErrUnknownOutcome", mode, err)
				}
				if n := proxy.seen.Load() - seen; n != 1 {
					t.Fatalf("mode %d: the claim statement was sent %d times", mode, n)
				}
				r, gerr := check.Get(ctx, []byte(key))
				switch mode {
				case cutAfter: // the server ran it once
					if gerr != nil || r.Attempts != 1 || r.State != idem.StateInProgress {
						t.Fatalf("record after a lost reply: %+v, %v; want in progress, attempt 1", r, gerr)
					}
				case cutBefore: // it never reached the server
					if !errors.Is(gerr, idem.ErrNotFound) {
						t.Fatalf("record of a claim that never arrived: %+v, %v", r, gerr)
					}
				}
			}

			// Idle connections broken under the pool: noticed before writing.
			if _, err := s.Claim(ctx, claimReq("warm")); err != nil {
				t.Fatal(err)
			}
			proxy.closeAll()
			time.Sleep(50 * time.Millisecond) // let the close reach the client side
			seen := proxy.seen.Load()
			c, err := s.Claim(ctx, claimReq("after-idle-cut"))
			if params["checkConnLiveness"] == "false" {
				// Without the liveness check the driver writes into the dead
				// socket and cannot tell whether it arrived.
				if err != nil && !errors.Is(err, idem.ErrUnknownOutcome) && !errors.Is(err, idem.ErrUnavailable) {
					t.Fatalf("claim on a dead idle connection: %v", err)
				}
				if n := proxy.seen.Load() - seen; n > 1 {
					t.Fatalf("claim sent %d times", n)
				}
				return
			}
			if err != nil || c.Outcome != idem.OutcomeAcquired {
				t.Fatalf("claim after idle connections broke = %+v, %v; want acquired on a new connection", c, err)
			}
			if n := proxy.seen.Load() - seen; n != 1 {
				t.Fatalf("claim after idle cut sent %d times", n)
			}
		})
	}
}
