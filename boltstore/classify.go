package boltstore

import (
	"errors"
	"fmt"
	"syscall"

	bberrors "go.etcd.io/bbolt/errors"

	"github.com/idem-dev/idem"
)

var _ idem.ErrorClassifier = (*Store)(nil)

// ClassifyError implements idem.ErrorClassifier. The store's own errors are
// classified where they arise and come back unchanged, a damaged record
// (idem.ErrCorrupt) included: it is not an infrastructure fault. For a raw
// error of bbolt or of the file:
//
//   - bbolt's lock timeout, a closed database or transaction, or running out
//     of space while growing the file or writing pages (an *os.PathError
//     "write" or bbolt's "file resize error" with ENOSPC, EDQUOT or EFBIG):
//     idem.ErrUnavailable, nothing was applied;
//   - any other I/O errno (EIO, or ENOSPC returned bare, as bbolt returns an
//     fdatasync error): idem.ErrUnknownOutcome, since a bare errno does not
//     say whether bbolt had written the meta page;
//   - anything else: idem.ClassifyError.
func (s *Store) ClassifyError(err error) error {
	var errno syscall.Errno
	switch {
	case err == nil || errors.Is(err, idem.ErrUnavailable) || errors.Is(err, idem.ErrUnknownOutcome) || errors.Is(err, idem.ErrCorrupt):
		return err
	case errors.Is(err, bberrors.ErrTimeout) || errors.Is(err, bberrors.ErrDatabaseNotOpen) ||
		errors.Is(err, bberrors.ErrTxClosed) || spaceBeforeWrite(err):
		return fmt.Errorf("%w: %w", idem.ErrUnavailable, err)
	case errors.As(err, &errno) && (errno == syscall.EIO || errno == syscall.ENOSPC || errno == syscall.EDQUOT ||
		errno == syscall.EFBIG || errno == syscall.EROFS):
		return fmt.Errorf("%w: %w", idem.ErrUnknownOutcome, err)
	}
	return idem.ClassifyError(err)
}
