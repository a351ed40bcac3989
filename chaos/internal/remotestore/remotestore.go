// Package remotestore serves an idem.Store over TCP (net/rpc, gob) and is
// its client: the fault harness runs the embedded store (boltstore, one
// process per file) in a store-server process that several consumer
// processes share, and that it can SIGKILL and restart.
//
// The client never re-sends a call. A failed dial is idem.ErrUnavailable
// (nothing sent); a connection lost or a deadline passed after a call was
// sent is idem.ErrUnknownOutcome (the server may have applied it); store
// errors travel as codes and come back as idem's sentinels.
package remotestore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/idem-dev/idem"
)

// Error codes on the wire.
const (
	codeNone = iota
	codeNotFound
	codeFenced
	codeMismatch
	codeInvalidKey
	codeInvalidArgument
	codeCapacity
	codeUnavailable
	codeUnknown
	codeCorrupt
	codeOther
)

var codes = []struct {
	code int
	err  error
}{
	{codeNotFound, idem.ErrNotFound},
	{codeFenced, idem.ErrFenced},
	{codeMismatch, idem.ErrFingerprintMismatch},
	{codeInvalidKey, idem.ErrInvalidKey},
	{codeInvalidArgument, idem.ErrInvalidArgument},
	{codeCapacity, idem.ErrCapacity},
	{codeCorrupt, idem.ErrCorrupt},
	{codeUnknown, idem.ErrUnknownOutcome}, // before unavailable: both may match
	{codeUnavailable, idem.ErrUnavailable},
}

// Reply carries a store answer.
type Reply struct {
	Claim  idem.Claim
	Record idem.Record
	Code   int
	Msg    string
}

func (r *Reply) setErr(err error) {
	if err == nil {
		return
	}
	r.Code, r.Msg = codeOther, err.Error()
	for _, c := range codes {
		if errors.Is(err, c.err) {
			r.Code = c.code
			return
		}
	}
}

func (r *Reply) err() error {
	if r.Code == codeNone {
		return nil
	}
	for _, c := range codes {
		if c.code == r.Code {
			return fmt.Errorf("remotestore: %w: %s", c.err, r.Msg)
		}
	}
	return errors.New("remotestore: server: " + r.Msg)
}

// Args carries a call.
type Args struct {
	Req    idem.ClaimRequest
	Key    []byte
	Token  uint64
	Result []byte
	Cause  string
	Lease  time.Duration
}

// Service is the server side; exported for net/rpc.
type Service struct {
	store   idem.Store
	timeout time.Duration
}

func (s *Service) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

func (s *Service) Claim(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	c, err := s.store.Claim(ctx, a.Req)
	r.Claim = c
	r.setErr(err)
	return nil
}

func (s *Service) Complete(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	r.setErr(s.store.Complete(ctx, a.Key, a.Token, a.Result))
	return nil
}

func (s *Service) Release(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	r.setErr(s.store.Release(ctx, a.Key, a.Token, a.Cause))
	return nil
}

func (s *Service) Fail(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	r.setErr(s.store.Fail(ctx, a.Key, a.Token, a.Cause))
	return nil
}

func (s *Service) Extend(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	r.setErr(s.store.Extend(ctx, a.Key, a.Token, a.Lease))
	return nil
}

func (s *Service) Get(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	rec, err := s.store.Get(ctx, a.Key)
	r.Record = rec
	r.setErr(err)
	return nil
}

func (s *Service) Delete(a Args, r *Reply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	r.setErr(s.store.Delete(ctx, a.Key))
	return nil
}

// Serve answers calls on ln with store until ln is closed.
func Serve(ln net.Listener, store idem.Store) error {
	srv := rpc.NewServer()
	if err := srv.RegisterName("Store", &Service{store: store, timeout: 30 * time.Second}); err != nil {
		return err
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go srv.ServeConn(conn)
	}
}

// Client is an idem.Store backed by a remote Serve.
type Client struct {
	addr    string
	timeout time.Duration

	mu     sync.Mutex
	c      *rpc.Client
	closed bool
}

var (
	_ idem.Store           = (*Client)(nil)
	_ idem.ErrorClassifier = (*Client)(nil)
)

// Dial returns a client for the server at addr. Calls dial lazily; timeout
// bounds each call (and each dial) when the caller's context has no
// earlier deadline.
func Dial(addr string, timeout time.Duration) *Client {
	return &Client{addr: addr, timeout: timeout}
}

func (c *Client) conn(ctx context.Context) (*rpc.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("remotestore: %w: client closed", idem.ErrUnavailable)
	}
	if c.c != nil {
		return c.c, nil
	}
	d := net.Dialer{Timeout: c.timeout}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("remotestore: %w: %w", idem.ErrUnavailable, err)
	}
	c.c = rpc.NewClient(nc)
	return c.c, nil
}

func (c *Client) drop(rc *rpc.Client) {
	c.mu.Lock()
	if c.c == rc {
		c.c = nil
	}
	c.mu.Unlock()
	_ = rc.Close()
}

func (c *Client) call(ctx context.Context, method string, a Args) (*Reply, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rc, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	r := new(Reply)
	call := rc.Go("Store."+method, a, r, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
	case <-ctx.Done():
		// The call may be applied later; this connection's order is
		// unknown from now on.
		c.drop(rc)
		return nil, fmt.Errorf("remotestore: %s: %w: %w", method, idem.ErrUnknownOutcome, ctx.Err())
	}
	if call.Error != nil {
		c.drop(rc)
		var se rpc.ServerError
		if errors.As(call.Error, &se) {
			return nil, fmt.Errorf("remotestore: %s: %s", method, se)
		}
		return nil, fmt.Errorf("remotestore: %s: %w: %w", method, idem.ErrUnknownOutcome, call.Error)
	}
	return r, r.err()
}

func (c *Client) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	r, err := c.call(ctx, "Claim", Args{Req: req})
	if err != nil {
		return idem.Claim{}, err
	}
	return r.Claim, nil
}

func (c *Client) Complete(ctx context.Context, key []byte, token uint64, result []byte) error {
	if err := errors.Join(idem.ValidateToken(key, token), idem.ValidateResult(result)); err != nil {
		return err
	}
	_, err := c.call(ctx, "Complete", Args{Key: key, Token: token, Result: result})
	return err
}

func (c *Client) Release(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := errors.Join(idem.ValidateToken(key, token), idem.ValidateCause(cause)); err != nil {
		return err
	}
	_, err := c.call(ctx, "Release", Args{Key: key, Token: token, Cause: cause})
	return err
}

func (c *Client) Fail(ctx context.Context, key []byte, token uint64, cause string) error {
	if err := errors.Join(idem.ValidateToken(key, token), idem.ValidateCause(cause)); err != nil {
		return err
	}
	_, err := c.call(ctx, "Fail", Args{Key: key, Token: token, Cause: cause})
	return err
}

func (c *Client) Extend(ctx context.Context, key []byte, token uint64, lease time.Duration) error {
	if err := errors.Join(idem.ValidateToken(key, token), idem.ValidateLease(lease)); err != nil {
		return err
	}
	_, err := c.call(ctx, "Extend", Args{Key: key, Token: token, Lease: lease})
	return err
}

func (c *Client) Get(ctx context.Context, key []byte) (idem.Record, error) {
	if err := idem.ValidateKey(key); err != nil {
		return idem.Record{}, err
	}
	r, err := c.call(ctx, "Get", Args{Key: key})
	if err != nil {
		return idem.Record{}, err
	}
	return r.Record, nil
}

func (c *Client) Delete(ctx context.Context, key []byte) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	_, err := c.call(ctx, "Delete", Args{Key: key})
	return err
}

// ClassifyError: the client's errors are classified already; anything
// else goes through idem.ClassifyError.
func (c *Client) ClassifyError(err error) error {
	if err == nil || errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) {
		return err
	}
	return idem.ClassifyError(err)
}

// Close drops the connection; later calls fail with ErrUnavailable.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.c != nil {
		err := c.c.Close()
		c.c = nil
		return err
	}
	return nil
}
