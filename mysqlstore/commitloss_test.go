package mysqlstore_test

import (
	"database/sql"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// cutProxy forwards TCP to the server and, when armed, cuts a connection at
// the client's COMMIT: either before forwarding it (the server never
// commits) or after forwarding it and swallowing the server's reply (the
// server commits, the client never hears).
type cutProxy struct {
	ln     net.Listener
	target string
	mode   atomic.Int32 // 0 off, 1 cut before COMMIT, 2 cut after COMMIT
	cuts   atomic.Int32
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

const (
	cutOff = iota
	cutBefore
	cutAfter
)

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
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
				isCommit := n == 7 && body[0] == 0x03 && string(body[1:]) == "COMMIT"
				if isCommit {
					switch p.mode.Load() {
					case cutBefore:
						p.mode.Store(cutOff)
						p.cuts.Add(1)
						return
					case cutAfter:
						p.mode.Store(cutOff)
						p.cuts.Add(1)
						mute.Store(true)
						s.Write(append(hdr, body...))
						time.Sleep(200 * time.Millisecond) // let the server commit
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
	db, err := sql.Open("mysql", dsn(proxy.ln.Addr().String(), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg := mysqlstore.Config{DB: db}
	ctx := testCtx(t)
	if err := mysqlstore.Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := mysqlstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

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
