package pgstore_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgProxy forwards PostgreSQL's wire protocol between clients and the
// server one request at a time (the messages up to a Sync, or a simple
// Query), so that a test can lose exactly the answer to a chosen request,
// or the request itself. It can also hand clients a PID of its choosing in
// BackendKeyData, as a pooler such as PgBouncer does.
type pgProxy struct {
	ln      net.Listener
	target  string
	fakePID atomic.Int32 // != 0: the PID every new client is told

	mu    sync.Mutex
	rule  *cutRule
	watch func(sql string) bool
	hits  int // requests executing a statement that watch matched, forwarded to the server
	// forwarding: the rules that fired in a mode that forwards the request
	// (cutAfter, cutDelayed); a cancel request waits until they finish.
	forwarding []*cutRule
	conns      []net.Conn
	wg         sync.WaitGroup
}

// cutMode says what happens to the request a rule matches. In every mode
// the client's connection is closed at once: it never gets an answer.
//
// pgx answers a connection that breaks mid-request with a cancel request
// on a new connection (pgconn's asyncClose). In the modes that forward the
// request, the proxy holds every cancel request until the forwarded
// requests have finished, so the server always runs them to the end:
// otherwise the cancel raced the statement and, when the machine was
// loaded, won it (57014, the statement rolled back) in 6 of 20 runs of
// TestLostReplyNotResent at load 17, and the test could not say what the
// server had done.
type cutMode int

// cancelRequestCode opens a CancelRequest in place of a startup message.
const cancelRequestCode = 80877102

const (
	// cutAfter forwards the request and waits for the server to finish it
	// (ReadyForQuery), then closes the server connection.
	cutAfter cutMode = iota + 1
	// cutBefore drops the request and closes the server connection: the
	// server sees the client leave.
	cutBefore
	// cutBeforeSilent drops the request and leaves the server connection
	// open and silent, as a network partition does: the server sees
	// nothing, its session waits for the next request.
	cutBeforeSilent
	// cutDelayed forwards the request after delay (it arrives late), waits
	// for the server to finish it, then closes the server connection.
	cutDelayed
)

type cutRule struct {
	match func(sql string) bool
	mode  cutMode
	delay time.Duration
	done  chan struct{} // closed once the rule has fired and finished
	once  sync.Once
}

func (r *cutRule) finish() { r.once.Do(func() { close(r.done) }) }

func newPgProxy(t *testing.T, target string) *pgProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
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

// pool returns a pool whose connections go through the proxy.
func (p *pgProxy) pool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(p.ln.Addr().(*net.TCPAddr).Port)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.TLSConfig = nil
	cfg.MaxConns = maxConns
	pp, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pp.Close)
	return pp
}

// arm makes the next request that executes a statement matching match fire
// the rule; it returns a channel closed when the rule has finished.
func (p *pgProxy) arm(match func(sql string) bool, mode cutMode, delay time.Duration) <-chan struct{} {
	r := &cutRule{match: match, mode: mode, delay: delay, done: make(chan struct{})}
	p.mu.Lock()
	p.rule = r
	p.mu.Unlock()
	return r.done
}

// setWatch counts, from now on, the requests forwarded to the server that
// execute a statement matching match.
func (p *pgProxy) setWatch(match func(sql string) bool) {
	p.mu.Lock()
	p.watch, p.hits = match, 0
	p.mu.Unlock()
}

func (p *pgProxy) watched() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hits
}

func sqlHas(word string) func(string) bool {
	return func(sql string) bool { return strings.Contains(strings.ToLower(sql), word) }
}

func (p *pgProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		pc := &proxyConn{p: p, c: c, u: u, stmts: map[string]string{}}
		p.wg.Add(2)
		go pc.clientToServer()
		go pc.serverToClient()
	}
}

type proxyConn struct {
	p    *pgProxy
	c, u net.Conn
	// stmts maps prepared statement names to their SQL (client side).
	stmts map[string]string
	// swallow: the client is gone; answers are dropped, and at the next
	// ReadyForQuery the server connection is closed and done is closed.
	mu      sync.Mutex
	swallow *cutRule
}

type pgMsg struct {
	typ  byte
	body []byte
}

func (m pgMsg) bytes() []byte {
	b := make([]byte, 5+len(m.body))
	b[0] = m.typ
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(m.body)))
	copy(b[5:], m.body)
	return b
}

func readMsg(r *bufio.Reader) (pgMsg, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return pgMsg{}, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n < 4 || n > 1<<30 {
		return pgMsg{}, fmt.Errorf("bad message length %d", n)
	}
	body := make([]byte, n-4)
	_, err := io.ReadFull(r, body)
	return pgMsg{h[0], body}, err
}

func cstr(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}

func (pc *proxyConn) clientToServer() {
	defer pc.p.wg.Done()
	defer pc.c.Close()
	r := bufio.NewReader(pc.c)
	// The startup message (or a cancel request) has no type byte.
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		pc.u.Close()
		return
	}
	start := make([]byte, binary.BigEndian.Uint32(n[:]))
	copy(start, n[:])
	if _, err := io.ReadFull(r, start[4:]); err != nil {
		pc.u.Close()
		return
	}
	if len(start) == 16 && binary.BigEndian.Uint32(start[4:]) == cancelRequestCode && pc.p.fakePID.Load() != 0 {
		// A cancel request carries the PID the client was told: a pooler
		// would map it back; this proxy drops it rather than cancel the
		// statement of the session that PID belongs to.
		pc.u.Close()
		return
	}
	if len(start) == 16 && binary.BigEndian.Uint32(start[4:]) == cancelRequestCode {
		pc.p.awaitForwarded()
	}
	if _, err := pc.u.Write(start); err != nil {
		return
	}
	var unit []pgMsg
	var executes []string // SQL of the statements the unit executes
	unnamed := ""
	for {
		m, err := readMsg(r)
		if err != nil {
			pc.u.Close()
			return
		}
		unit = append(unit, m)
		switch m.typ {
		case 'P':
			name, rest := cstr(m.body)
			sql, _ := cstr(rest)
			if name == "" {
				unnamed = sql
			} else {
				pc.stmts[name] = sql
			}
		case 'B':
			_, rest := cstr(m.body)
			name, _ := cstr(rest)
			if name == "" {
				executes = append(executes, unnamed)
			} else {
				executes = append(executes, pc.stmts[name])
			}
		case 'Q':
			sql, _ := cstr(m.body)
			executes = append(executes, sql)
		}
		if m.typ != 'S' && m.typ != 'Q' && m.typ != 'H' && m.typ != 'X' {
			continue // the request goes on
		}
		var buf []byte
		for _, um := range unit {
			buf = append(buf, um.bytes()...)
		}
		rule := pc.fire(executes)
		unit, executes = unit[:0], executes[:0]
		if rule == nil {
			if _, err := pc.u.Write(buf); err != nil {
				return
			}
			continue
		}
		pc.c.Close() // the client gets no answer
		switch rule.mode {
		case cutAfter, cutDelayed:
			pc.mu.Lock()
			pc.swallow = rule
			pc.mu.Unlock()
			time.Sleep(rule.delay)
			if _, err := pc.u.Write(buf); err != nil {
				pc.u.Close()
				rule.finish()
			}
		case cutBefore:
			pc.u.Close()
			rule.finish()
		case cutBeforeSilent:
			rule.finish() // pc.u stays open until the test ends
		}
		return
	}
}

// fire returns the armed rule if the request executes a statement it
// matches (disarming it), and counts watched requests that go through.
func (pc *proxyConn) fire(executes []string) *cutRule {
	p := pc.p
	p.mu.Lock()
	defer p.mu.Unlock()
	var rule *cutRule
	for _, sql := range executes {
		if p.rule != nil && p.rule.match(sql) {
			rule, p.rule = p.rule, nil
			break
		}
	}
	forwarded := rule == nil || rule.mode == cutAfter || rule.mode == cutDelayed
	if rule != nil && forwarded {
		p.forwarding = append(p.forwarding, rule)
	}
	for _, sql := range executes {
		if forwarded && p.watch != nil && p.watch(sql) {
			p.hits++
			break
		}
	}
	return rule
}

// awaitForwarded waits until every rule that forwarded its request has
// finished: the server has answered the request or left.
func (p *pgProxy) awaitForwarded() {
	p.mu.Lock()
	rules := append([]*cutRule(nil), p.forwarding...)
	p.mu.Unlock()
	for _, r := range rules {
		<-r.done
	}
}

func (pc *proxyConn) serverToClient() {
	defer pc.p.wg.Done()
	defer pc.c.Close() // the server left: so does the client
	defer pc.u.Close()
	r := bufio.NewReader(pc.u)
	w := bufio.NewWriter(pc.c)
	for {
		m, err := readMsg(r)
		pc.mu.Lock()
		swallow := pc.swallow
		pc.mu.Unlock()
		if err != nil {
			if swallow != nil {
				swallow.finish()
			}
			return
		}
		if swallow != nil {
			if m.typ == 'Z' {
				swallow.finish()
				return
			}
			continue
		}
		if m.typ == 'K' && len(m.body) == 8 {
			if pid := pc.p.fakePID.Load(); pid != 0 {
				binary.BigEndian.PutUint32(m.body, uint32(pid))
			}
		}
		if _, err := w.Write(m.bytes()); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}
