package redisstore

import (
	"context"
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/redisx/script"
)

var _ idem.ForceReleaser = (*Store)(nil)

// forceReleaseScript releases the record whatever its token, by running
// update's release with the record's own token. KEYS: record. ARGV: cause,
// its length. Returns update's code, or -4 when the record is not in
// progress.
var forceReleaseScript = script.New(luaPrelude + luaUpdate + `
local v = redis.pcall('GET', KEYS[1])
if not v then return 0 end
if type(v) == 'table' then return -2 end
local h = parse(v)
if not h then return -2 end
if h.s ~= 'p' then return -4 end
return update(KEYS[1], 'r', h.t, ARGV[1], ARGV[2])
`)

// ForceRelease implements idem.ForceReleaser with one script run.
func (s *Store) ForceRelease(ctx context.Context, key []byte, cause string) error {
	if err := idem.ValidateKey(key); err != nil {
		return err
	}
	if err := idem.ValidateCause(cause); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	rk, _ := s.keysOf(key)
	c := &call{script: forceReleaseScript, keys: []string{rk}, args: []any{cause, len(cause)}}
	if err := s.run(ctx, []*call{c}, "force release"); err != nil {
		return err
	}
	n, err := c.cmd.Int64()
	if err != nil {
		return fmt.Errorf("redisstore: force release: unexpected reply: %w", err)
	}
	if n == -4 {
		return fmt.Errorf("%w: key %q", idem.ErrNotInProgress, trunc(key))
	}
	return updateErr(n, key, 0)
}
