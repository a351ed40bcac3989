package remoting

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// ErrConnClosed is returned by Invoke on a closed or broken connection.
var ErrConnClosed = errors.New("remoting: connection closed")

// Conn is a client connection that sends requests and matches their
// responses by opaque; requests the peer sends are dropped. Safe for
// concurrent use.
type Conn struct {
	nc      net.Conn
	wmu     sync.Mutex
	mu      sync.Mutex
	pending map[int32]chan *Command
	err     error
	opaque  atomic.Int32
	done    chan struct{}
}

// Dial connects to addr.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &Conn{nc: nc, pending: map[int32]chan *Command{}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

func (c *Conn) read() {
	defer close(c.done)
	r := bufio.NewReader(c.nc)
	for {
		cmd, err := ReadFrame(r)
		if err != nil {
			c.fail(err)
			return
		}
		if !cmd.IsResponse() {
			continue
		}
		c.mu.Lock()
		ch := c.pending[cmd.Opaque]
		delete(c.pending, cmd.Opaque)
		c.mu.Unlock()
		if ch != nil {
			ch <- cmd
		}
	}
}

func (c *Conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrConnClosed, err)
	}
	for o, ch := range c.pending {
		close(ch)
		delete(c.pending, o)
	}
}

// Invoke sends req (its Opaque is assigned here) and waits for the
// response or ctx's end.
func (c *Conn) Invoke(ctx context.Context, req *Command) (*Command, error) {
	req.Opaque = c.opaque.Add(1)
	ch := make(chan *Command, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.pending[req.Opaque] = ch
	c.mu.Unlock()
	b, err := Encode(req)
	if err == nil {
		c.wmu.Lock()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.nc.SetWriteDeadline(dl)
		}
		_, err = c.nc.Write(b)
		c.wmu.Unlock()
	}
	if err != nil {
		c.mu.Lock()
		delete(c.pending, req.Opaque)
		c.mu.Unlock()
		return nil, err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			c.mu.Lock()
			defer c.mu.Unlock()
			return nil, c.err
		}
		return resp, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, req.Opaque)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

// Close closes the connection and waits for its reader to end.
func (c *Conn) Close() error {
	err := c.nc.Close()
	<-c.done
	return err
}
