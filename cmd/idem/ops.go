package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem"
)

func init() {
	subcommands = append(subcommands, inspectCmd, keysCmd, evictCmd, releaseCmd, gcCmd, migrateCmd, statsCmd)
}

// keyFlags reads a key given as text (the argument) or with --key-b64 /
// --key-hex for bytes a shell cannot pass.
type keyFlags struct{ b64, hex string }

func (k *keyFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.b64, "key-b64", "", "the key as standard base64 (instead of KEY)")
	cmd.Flags().StringVar(&k.hex, "key-hex", "", "the key as hex (instead of KEY)")
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		n := len(args)
		if k.b64 != "" {
			n++
		}
		if k.hex != "" {
			n++
		}
		if n != 1 {
			return usageError("%s: give the key once: KEY, --key-b64 or --key-hex", cmd.Name())
		}
		return nil
	}
}

func (k *keyFlags) key(args []string) ([]byte, error) {
	var key []byte
	var err error
	switch {
	case len(args) == 1:
		key = []byte(args[0])
	case k.b64 != "":
		if key, err = base64.StdEncoding.DecodeString(k.b64); err != nil {
			return nil, usageError("--key-b64: %v", err)
		}
	default:
		if key, err = hex.DecodeString(k.hex); err != nil {
			return nil, usageError("--key-hex: %v", err)
		}
	}
	if err := idem.ValidateKey(key); err != nil {
		return nil, &exitErr{code: exitUsage, err: err}
	}
	return key, nil
}

// withStore runs fn on the --namespace handle of the --store backend within
// --timeout. A timeout is reported as the store being unavailable (exit 3).
func (g *globals) withStore(cmd *cobra.Command, o openOptions, fn func(ctx context.Context, s idem.Store, b *backend) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	s, b, err := g.open(ctx, o)
	if err != nil {
		return err
	}
	defer b.Close()
	err = fn(ctx, s, b)
	if err != nil && ctx.Err() == context.DeadlineExceeded && !errors.Is(err, idem.ErrUnknownOutcome) {
		err = fmt.Errorf("%w: %s did not answer within --timeout %s: %w", idem.ErrUnavailable, b.url, g.timeout, err)
	}
	return err
}

// recordJSON is a record as the commands print it with --json. The key and
// result are given as text when they are valid UTF-8 and always in base64.
type recordJSON struct {
	Key         string     `json:"key,omitempty"`
	KeyB64      string     `json:"key_b64"`
	State       string     `json:"state"`
	Token       uint64     `json:"token"`
	Attempts    int        `json:"attempts"`
	Fingerprint string     `json:"fingerprint_hex,omitempty"`
	Result      string     `json:"result,omitempty"`
	ResultB64   string     `json:"result_b64,omitempty"`
	LastError   string     `json:"last_error,omitempty"`
	LeaseUntil  *time.Time `json:"lease_until,omitempty"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	CreatedAt   *time.Time `json:"created_at,omitempty"`
	UpdatedAt   *time.Time `json:"updated_at,omitempty"`
}

func tptr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

func toJSON(r idem.Record) recordJSON {
	j := recordJSON{
		KeyB64: base64.StdEncoding.EncodeToString(r.Key), State: r.State.String(), Token: r.Token,
		Attempts: r.Attempts, Fingerprint: hex.EncodeToString(r.Fingerprint), LastError: r.LastError,
		LeaseUntil: tptr(r.LeaseUntil), ExpiresAt: tptr(r.ExpiresAt), CreatedAt: tptr(r.CreatedAt), UpdatedAt: tptr(r.UpdatedAt),
	}
	if utf8.Valid(r.Key) {
		j.Key = string(r.Key)
	}
	if len(r.Result) > 0 {
		j.ResultB64 = base64.StdEncoding.EncodeToString(r.Result)
		if utf8.Valid(r.Result) {
			j.Result = string(r.Result)
		}
	}
	return j
}

// printKey shows a key as Go-quoted text (so NUL, newlines and invalid
// UTF-8 are visible and unambiguous).
func printKey(k []byte) string { return fmt.Sprintf("%q", k) }

func (g *globals) emit(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (g *globals) printRecord(r idem.Record) error {
	if g.json {
		return g.emit(toJSON(r))
	}
	g.printf("key:          %s\n", printKey(r.Key))
	g.printf("state:        %s\n", r.State)
	g.printf("token:        %d\n", r.Token)
	g.printf("attempts:     %d\n", r.Attempts)
	if len(r.Fingerprint) > 0 {
		g.printf("fingerprint:  %x\n", r.Fingerprint)
	}
	if r.Result != nil {
		g.printf("result:       %q\n", r.Result)
	}
	if r.LastError != "" {
		g.printf("last error:   %s\n", r.LastError)
	}
	ts := func(name string, t time.Time) {
		if !t.IsZero() {
			g.printf("%-13s %s\n", name+":", t.UTC().Format(time.RFC3339Nano))
		}
	}
	if r.State == idem.StateInProgress {
		ts("lease until", r.LeaseUntil)
	}
	ts("expires at", r.ExpiresAt)
	ts("created at", r.CreatedAt)
	ts("updated at", r.UpdatedAt)
	return nil
}

func inspectCmd(g *globals) *cobra.Command {
	var k keyFlags
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "show the record of a key (exit 4 when there is none)",
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := k.key(args)
			if err != nil {
				return err
			}
			return g.withStore(cmd, openOptions{existing: true}, func(ctx context.Context, s idem.Store, b *backend) error {
				r, err := s.Get(ctx, key)
				if err != nil {
					return err
				}
				return g.printRecord(r)
			})
		},
	}
	k.add(cmd)
	return cmd
}

func evictCmd(g *globals) *cobra.Command {
	var k keyFlags
	cmd := &cobra.Command{
		Use:   "evict KEY",
		Short: "delete the record of a key: its next delivery runs the effect again (exit 0 whether or not it existed)",
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := k.key(args)
			if err != nil {
				return err
			}
			return g.withStore(cmd, openOptions{existing: true}, func(ctx context.Context, s idem.Store, b *backend) error {
				if err := s.Delete(ctx, key); err != nil {
					return err
				}
				if g.json {
					return g.emit(map[string]any{"evicted": true, "key_b64": base64.StdEncoding.EncodeToString(key)})
				}
				g.printf("evicted %s\n", printKey(key))
				return nil
			})
		},
	}
	k.add(cmd)
	return cmd
}

func releaseCmd(g *globals) *cobra.Command {
	var k keyFlags
	var cause string
	cmd := &cobra.Command{
		Use:   "release KEY",
		Short: "force-release a key stuck in progress whatever its token: its holder is fenced, the next delivery claims it (exit 5 if not in progress)",
		Long: `Force-release a key stuck in progress (its worker died holding a long lease).

The record moves to released with --cause as its last error; the holder's
token is fenced (its complete, fail and extend are refused) and the next claim
acquires the key with a larger token. Only for workers known to be dead: a
holder still running has its effect done anyway, and the next delivery runs it
again. Exit 4 when there is no record, 5 when it is not in progress.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := k.key(args)
			if err != nil {
				return err
			}
			if err := idem.ValidateCause(cause); err != nil {
				return &exitErr{code: exitUsage, err: fmt.Errorf("--cause: %w", err)}
			}
			return g.withStore(cmd, openOptions{existing: true}, func(ctx context.Context, s idem.Store, b *backend) error {
				fr, ok := s.(idem.ForceReleaser)
				if !ok {
					return fmt.Errorf("release: %w (%T)", errUnsupported, s)
				}
				if err := fr.ForceRelease(ctx, key, cause); err != nil {
					return err
				}
				r, err := s.Get(ctx, key)
				if err != nil {
					return fmt.Errorf("released, but reading it back: %w", err)
				}
				return g.printRecord(r)
			})
		},
	}
	k.add(cmd)
	cmd.Flags().StringVar(&cause, "cause", "released by an operator", "recorded as the record's last error")
	return cmd
}

func keysCmd(g *globals) *cobra.Command {
	var state, cursor string
	var limit int
	cmd := &cobra.Command{
		Use:   "keys --state in_progress",
		Short: "list the keys in progress (live or lapsed leases), a page at a time",
		Long: `List the records in progress (live or lapsed leases), for finding stuck work.

Pages: --limit records per call; when more remain the next cursor is printed
(in --json, "next_cursor"): pass it back with --cursor.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if state != idem.StateInProgress.String() {
				return usageError("--state %q: only %q can be listed (stores index records in progress only)", state, idem.StateInProgress.String())
			}
			if limit < 1 || limit > 10000 {
				return usageError("--limit %d outside [1, 10000]", limit)
			}
			return g.withStore(cmd, openOptions{existing: true}, func(ctx context.Context, s idem.Store, b *backend) error {
				l, ok := s.(idem.Lister)
				if !ok {
					return fmt.Errorf("keys: %w (%T)", errUnsupported, s)
				}
				recs, next, err := l.ListInProgress(ctx, cursor, limit)
				if err != nil {
					return err
				}
				if g.json {
					out := struct {
						Records    []recordJSON `json:"records"`
						NextCursor string       `json:"next_cursor"`
					}{Records: []recordJSON{}, NextCursor: next}
					for _, r := range recs {
						out.Records = append(out.Records, toJSON(r))
					}
					return g.emit(out)
				}
				now := time.Now()
				for _, r := range recs {
					lease := "lease lapsed " + now.Sub(r.LeaseUntil).Round(time.Second).String() + " ago"
					if r.LeaseUntil.After(now) {
						lease = "lease until " + r.LeaseUntil.UTC().Format(time.RFC3339)
					}
					g.printf("%s\ttoken %d\tattempts %d\t%s\n", printKey(r.Key), r.Token, r.Attempts, lease)
				}
				if next != "" {
					g.printf("next cursor: %s\n", next)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&state, "state", idem.StateInProgress.String(), "records in this state (only in_progress)")
	cmd.Flags().IntVar(&limit, "limit", 100, "records per page (1..10000)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "the cursor a previous page printed")
	return cmd
}

func statsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "count the live records by state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withStore(cmd, openOptions{existing: true}, func(ctx context.Context, s idem.Store, b *backend) error {
				st, ok := s.(idem.Stater)
				if !ok {
					return fmt.Errorf("stats: %w (%T)", errUnsupported, s)
				}
				n, err := st.Stats(ctx)
				if err != nil {
					return err
				}
				if g.json {
					return g.emit(map[string]int64{"in_progress": n.InProgress, "completed": n.Completed, "failed": n.Failed, "released": n.Released, "total": n.Total()})
				}
				g.printf("in_progress %d\ncompleted   %d\nfailed      %d\nreleased    %d\ntotal       %d\n", n.InProgress, n.Completed, n.Failed, n.Released, n.Total())
				return nil
			})
		},
	}
}

func gcCmd(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "purge records past their retention now (archived first when the store URL says archive=true), and run partition maintenance",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return usageError("--limit %d < 0", limit)
			}
			return g.withStore(cmd, openOptions{existing: true}, func(ctx context.Context, s idem.Store, b *backend) error {
				p, ok := s.(idem.Purger)
				if !ok {
					return fmt.Errorf("gc: %w (%T)", errUnsupported, s)
				}
				n, err := p.Purge(ctx, limit)
				if err != nil {
					return fmt.Errorf("purge (%d removed before the error): %w", n, err)
				}
				var done []string
				if b.Maintain != nil {
					if done, err = b.Maintain(ctx, s); err != nil {
						return fmt.Errorf("maintenance (after purging %d): %w", n, err)
					}
				}
				if g.json {
					return g.emit(map[string]any{"purged": n, "maintenance": append([]string{}, done...)})
				}
				g.printf("purged %d record(s)\n", n)
				for _, d := range done {
					g.printf("%s\n", d)
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "purge at most this many records (0: all)")
	return cmd
}

func migrateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "create or upgrade the store's schema (PostgreSQL, MySQL; idempotent, run at every deploy)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
			b, err := openBackend(ctx, g.store, openOptions{})
			if err != nil {
				return err
			}
			defer b.Close()
			if b.Migrate == nil {
				if g.json {
					return g.emit(map[string]any{"store": b.url, "migrated": false})
				}
				g.printf("%s has no schema to migrate\n", b.url)
				return nil
			}
			if err := b.Migrate(ctx); err != nil {
				if ctx.Err() != nil && !errors.Is(err, idem.ErrUnavailable) {
					err = fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
				}
				return err
			}
			if g.json {
				return g.emit(map[string]any{"store": b.url, "migrated": true})
			}
			g.printf("%s: schema up to date\n", b.url)
			return nil
		},
	}
}
