package redistest

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a Redis server that can lose a reply:
// after CutReply(match), the next request whose bytes contain match
// (case-insensitive, within one read) reaches the server, and as soon as
// the server's reply starts coming back, both connections are closed
// without forwarding a byte of it. The server ran the command; the client
// sees its connection drop and cannot tell.
type Proxy struct {
	t      testing.TB
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   []byte   // armed match, lowercased; nil when disarmed
	reqs  [][]byte // every request chunk forwarded, lowercased
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards every connection
// to target; it stops in t.Cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy listen: %v", err)
	}
	p := &Proxy{t: t, target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// CutReply arms one cut (see Proxy).
func (p *Proxy) CutReply(match string) {
	p.mu.Lock()
	p.cut = bytes.ToLower([]byte(match))
	p.mu.Unlock()
}

// Armed reports whether a cut is armed and has not happened yet.
func (p *Proxy) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut != nil
}

// Count is the number of occurrences of match (case-insensitive) in the
// requests forwarded so far.
func (p *Proxy) Count(match string) int {
	m := bytes.ToLower([]byte(match))
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.reqs {
		n += bytes.Count(r, m)
	}
	return n
}

func (p *Proxy) accept() {
	defer p.wg.Done()
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
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		var cut sync.Once
		drop := make(chan struct{}) // closed: drop the next reply
		closeBoth := func() {
			c.Close()
			s.Close()
			p.mu.Lock()
			delete(p.conns, c)
			delete(p.conns, s)
			p.mu.Unlock()
		}
		p.wg.Add(2)
		go func() { // client -> server
			defer p.wg.Done()
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					low := bytes.ToLower(buf[:n])
					p.mu.Lock()
					p.reqs = append(p.reqs, low)
					if p.cut != nil && bytes.Contains(low, p.cut) {
						p.cut = nil
						cut.Do(func() { close(drop) })
					}
					p.mu.Unlock()
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server -> client
			defer p.wg.Done()
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					select {
					case <-drop:
						return // the server answered: lose the answer
					default:
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}
