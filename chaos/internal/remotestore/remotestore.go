// Package remotestore serves an idem.Store over TCP (net/rpc, gob) and is
// its client: the fault harness runs the embedded store (boltstore, one
// process per file) in a store-server process that several consumer
// processes share, and that it can SIGKILL and restart.
//
// The client never re-sends a call. A failed dial is idem.ErrUnavailable
// (nothing sent); a connection lost or a deadline passed after a call was
// sent is idem.ErrUnknownOutcome (the server may have applied it); store
// errors travel as codes and come back as idem's sentinels.
//
// The batch capabilities (idem.BatchClaimer, idem.BatchCompleter,
// idem.BatchExtender) are one call each: the client always has them, and
// the server forwards each to the served store's own batch method, so a
// batch consumer's claims, completions and heartbeat cross a killed store
// server as one round trip, as they do on a networked store. The answer
// carries one result (and error code) per entry; a whole-call failure,
// including a connection lost after the call was sent
// (idem.ErrUnknownOutcome), fails every entry, as the interfaces say. A
// served store without a capability gets the entries one by one through
// its single-record methods (each completion and extension is independent
// anyway; a claim batch stopped by a failure other than an entry's own is
// a whole-call failure, idem.ErrUnknownOutcome once an entry was applied).
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

// entryErr is an error that belongs to one entry of a batch claim (the
// others proceed); any other error stops the batch.
func entryErr(err error) bool {
	return errors.Is(err, idem.ErrInvalidKey) || errors.Is(err, idem.ErrInvalidArgument) ||
		errors.Is(err, idem.ErrFingerprintMismatch) || errors.Is(err, idem.ErrCorrupt)
}

// BatchArgs carries a batch call: one of its slices.
type BatchArgs struct {
	Reqs        []idem.ClaimRequest
	Completions []idem.Completion
	Extensions  []idem.Extension
}

// BatchReply carries a batch answer: the per-entry claims (ClaimBatch)
// and error codes, or the whole call's error.
type BatchReply struct {
	Claims []idem.Claim
	Codes  []int
	Msgs   []string
	Reply  // the whole call's error
}

func (r *BatchReply) setErrs(errs []error) {
	r.Codes, r.Msgs = make([]int, len(errs)), make([]string, len(errs))
	for i, err := range errs {
		var e Reply
		e.setErr(err)
		r.Codes[i], r.Msgs[i] = e.Code, e.Msg
	}
}

// errs is the per-entry errors of an answer to n entries.
func (r *BatchReply) errs(method string, n int) ([]error, error) {
	if len(r.Codes) != n || len(r.Msgs) != n {
		return nil, fmt.Errorf("remotestore: %s: %w: %d results for %d entries", method, idem.ErrUnknownOutcome, len(r.Codes), n)
	}
	errs := make([]error, n)
	for i := range n {
		errs[i] = (&Reply{Code: r.Codes[i], Msg: r.Msgs[i]}).err()
	}
	return errs, nil
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

func (s *Service) ClaimBatch(a BatchArgs, r *BatchReply) error {
	ctx, cancel := s.ctx()
	defer cancel()
	var res []idem.BatchResult
	var err error
	if bc, ok := s.store.(idem.BatchClaimer); ok {
		res, err = bc.ClaimBatch(ctx, a.Reqs)
	} else {
		res, err = claimOneByOne(ctx, s.store, a.Reqs)
	}
	if err != nil {
		r.setErr(err)
		return nil
	}
	r.Claims = make([]idem.Claim, len(res))
	errs := make([]error, len(res))
	for i, br := range res {
		r.Claims[i], errs[i] = br.Claim, br.Err
	}
	r.setErrs(errs)
	return nil
}

// claimOneByOne is ClaimBatch over a store without it.
func claimOneByOne(ctx context.Context, st idem.Store, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	res := make([]idem.BatchResult, len(reqs))
	for i, req := range reqs {
		c, err := st.Claim(ctx, req)
		switch {
		case err == nil:
			res[i].Claim = c
		case entryErr(err):
			res[i].Err = err
		case i == 0:
			return nil, err
		default:
			return nil, fmt.Errorf("%w: claim %d of %d: %w", idem.ErrUnknownOutcome, i+1, len(reqs), err)
		}
	}
	return res, nil
}

func (s *Service) CompleteBatch(a BatchArgs, r *BatchReply) error {
	return s.answer(r, func(ctx context.Context) ([]error, error) {
		if bc, ok := s.store.(idem.BatchCompleter); ok {
			return bc.CompleteBatch(ctx, a.Completions)
		}
		return each(a.Completions, func(c idem.Completion) error { return s.store.Complete(ctx, c.Key, c.Token, c.Result) }), nil
	})
}

func (s *Service) ExtendBatch(a BatchArgs, r *BatchReply) error {
	return s.answer(r, func(ctx context.Context) ([]error, error) {
		if be, ok := s.store.(idem.BatchExtender); ok {
			return be.ExtendBatch(ctx, a.Extensions)
		}
		return each(a.Extensions, func(e idem.Extension) error { return s.store.Extend(ctx, e.Key, e.Token, e.Lease) }), nil
	})
}

// answer puts the per-entry errors of f, or its whole-call error, in r.
func (s *Service) answer(r *BatchReply, f func(ctx context.Context) ([]error, error)) error {
	ctx, cancel := s.ctx()
	defer cancel()
	errs, err := f(ctx)
	if err != nil {
		r.setErr(err)
		return nil
	}
	r.setErrs(errs)
	return nil
}

// each applies f to every entry, independently: a batch over a store
// without the batch method.
func each[T any](entries []T, f func(T) error) []error {
	errs := make([]error, len(entries))
	for i, e := range entries {
		errs[i] = f(e)
	}
	return errs
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
	_ idem.BatchClaimer    = (*Client)(nil)
	_ idem.BatchCompleter  = (*Client)(nil)
	_ idem.BatchExtender   = (*Client)(nil)
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

// answer is a reply that carries the call's error.
type answer interface{ err() error }

func (c *Client) call(ctx context.Context, method string, a Args) (*Reply, error) {
	r := new(Reply)
	return r, c.do(ctx, method, a, r)
}

func (c *Client) do(ctx context.Context, method string, a any, r answer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rc, err := c.conn(ctx)
	if err != nil {
		return err
	}
	call := rc.Go("Store."+method, a, r, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
	case <-ctx.Done():
		// The call may be applied later; this connection's order is
		// unknown from now on.
		c.drop(rc)
		return fmt.Errorf("remotestore: %s: %w: %w", method, idem.ErrUnknownOutcome, ctx.Err())
	}
	if call.Error != nil {
		c.drop(rc)
		var se rpc.ServerError
		if errors.As(call.Error, &se) {
			return fmt.Errorf("remotestore: %s: %s", method, se)
		}
		return fmt.Errorf("remotestore: %s: %w: %w", method, idem.ErrUnknownOutcome, call.Error)
	}
	return r.err()
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

// ClaimBatch claims reqs in one call; see the package doc.
func (c *Client) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]idem.BatchResult, error) {
	r := new(BatchReply)
	if err := c.do(ctx, "ClaimBatch", BatchArgs{Reqs: reqs}, r); err != nil {
		return nil, err
	}
	errs, err := r.errs("ClaimBatch", len(reqs))
	if err == nil && len(r.Claims) != len(reqs) {
		err = fmt.Errorf("remotestore: ClaimBatch: %w: %d claims for %d entries", idem.ErrUnknownOutcome, len(r.Claims), len(reqs))
	}
	if err != nil {
		return nil, err
	}
	res := make([]idem.BatchResult, len(reqs))
	for i := range res {
		if errs[i] != nil {
			res[i].Err = errs[i]
			continue
		}
		res[i].Claim = r.Claims[i]
	}
	return res, nil
}

// CompleteBatch completes cs in one call; see the package doc.
func (c *Client) CompleteBatch(ctx context.Context, cs []idem.Completion) ([]error, error) {
	r := new(BatchReply)
	if err := c.do(ctx, "CompleteBatch", BatchArgs{Completions: cs}, r); err != nil {
		return nil, err
	}
	return r.errs("CompleteBatch", len(cs))
}

// ExtendBatch extends es in one call; see the package doc.
func (c *Client) ExtendBatch(ctx context.Context, es []idem.Extension) ([]error, error) {
	r := new(BatchReply)
	if err := c.do(ctx, "ExtendBatch", BatchArgs{Extensions: es}, r); err != nil {
		return nil, err
	}
	return r.errs("ExtendBatch", len(es))
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
