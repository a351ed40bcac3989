package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"

	bberrors "go.etcd.io/bbolt/errors"

	"github.com/idem-dev/idem"
)

func TestClassifyError(t *testing.T) {
	s := openTemp(t, func(c *Config) { c.SweepInterval = -1 })
	for _, tc := range []struct {
		name string
		err  error
		want error // nil: returned unchanged
	}{
		{"nil", nil, nil},
		{"already unavailable", fmt.Errorf("%w: x", idem.ErrUnavailable), nil},
		{"already unknown", fmt.Errorf("%w: x", idem.ErrUnknownOutcome), nil},
		{"damaged record", fmt.Errorf("%w: %w: key %q", idem.ErrCorrupt, ErrCorrupt, "k"), nil},
		{"fenced", idem.ErrFenced, nil},
		{"lock timeout", bberrors.ErrTimeout, idem.ErrUnavailable},
		{"closed database", bberrors.ErrDatabaseNotOpen, idem.ErrUnavailable},
		{"closed transaction", bberrors.ErrTxClosed, idem.ErrUnavailable},
		{"page write ENOSPC", &os.PathError{Op: "write", Path: "f", Err: syscall.ENOSPC}, idem.ErrUnavailable},
		{"grow EFBIG", errors.New("file resize error: truncate f: file too large"), idem.ErrUnavailable},
		{"fdatasync EIO", syscall.EIO, idem.ErrUnknownOutcome},
		{"fdatasync ENOSPC", syscall.ENOSPC, idem.ErrUnknownOutcome},
		{"page write EIO", &os.PathError{Op: "write", Path: "f", Err: syscall.EIO}, idem.ErrUnknownOutcome},
		{"context", context.Canceled, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s.ClassifyError(tc.err)
			if tc.want == nil {
				if got != tc.err {
					t.Fatalf("ClassifyError(%v) = %v, want it unchanged", tc.err, got)
				}
				return
			}
			if !errors.Is(got, tc.want) || !errors.Is(got, tc.err) {
				t.Fatalf("ClassifyError(%v) = %v, want %v wrapping it", tc.err, got, tc.want)
			}
		})
	}
}
