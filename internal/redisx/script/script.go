// Package script sends Lua scripts to Redis at most once per call.
//
// go-redis re-sends a command whose reply it did not get: Options.MaxRetries
// (3 by default) on a Client, and on a ClusterClient also its MaxRedirects
// loop, which retries a network error on the same node and then on another
// one even with MaxRetries -1. The retries run below the hooks, so nothing
// outside go-redis sees them. For a script whose first run was applied, a
// re-send runs it a second time: a claim then reports its own key in
// progress (or takes it over with one more attempt), a reentrant lock
// release counts twice. A command whose NoRetry method reports true is
// never re-sent once it may have reached the server (go-redis still
// re-sends one that provably never left the client). Scripts here are
// always sent that way, so a lost reply surfaces as an error the caller
// maps onto idem.ErrUnknownOutcome.
package script

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Script is a Lua script and its SHA1.
type Script struct {
	src, hash string
}

// New returns the script with source src.
func New(src string) *Script {
	h := sha1.Sum([]byte(src))
	return &Script{src: src, hash: hex.EncodeToString(h[:])}
}

// Hash is the script's SHA1 in hex (what EVALSHA takes).
func (s *Script) Hash() string { return s.hash }

// Processor is what runs commands: a redis.UniversalClient or a
// redis.Pipeliner.
type Processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// once is a command go-redis never re-sends after it may have been
// written: its retry loops skip a command whose NoRetry is true. The
// embedded *redis.Cmd carries the reply.
type once struct{ *redis.Cmd }

func (once) NoRetry() bool { return true }

func (s *Script) cmd(ctx context.Context, name, body string, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, body, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	c := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		c.SetFirstKeyPos(3)
	}
	return c
}

// EvalSha queues (on a pipeline) or sends EVALSHA on p, never re-sent.
func (s *Script) EvalSha(ctx context.Context, p Processor, keys []string, args ...any) *redis.Cmd {
	c := s.cmd(ctx, "evalsha", s.hash, keys, args)
	_ = p.Process(ctx, once{c})
	return c
}

// Eval queues or sends EVAL with the source on p, never re-sent.
func (s *Script) Eval(ctx context.Context, p Processor, keys []string, args ...any) *redis.Cmd {
	c := s.cmd(ctx, "eval", s.src, keys, args)
	_ = p.Process(ctx, once{c})
	return c
}

// Run sends EVALSHA and, only if the server answers NOSCRIPT (it does not
// have the script, so nothing ran), EVAL. Each is sent once: a lost reply
// is the command's error, never a second run.
func (s *Script) Run(ctx context.Context, p Processor, keys []string, args ...any) *redis.Cmd {
	c := s.EvalSha(ctx, p, keys, args...)
	if NoScript(c.Err()) {
		c = s.Eval(ctx, p, keys, args...)
	}
	return c
}

// NoScript reports a NOSCRIPT reply: the server does not have the script,
// so it did not run.
func NoScript(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || strings.HasPrefix(err.Error(), "NOSCRIPT"))
}
