package pgstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// FuzzParseCursor feeds ListInProgress arbitrary cursors (they come back
// from callers): a cursor is accepted only if it names a table in range,
// anything else is idem.ErrInvalidArgument, and an accepted cursor prints
// back (as ListInProgress writes it) to one that parses the same.
func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"", "0.0.", "3.1700000000000000.00ff", "1.-5.ab", "9.0.zz", "0..", "a.b.c", "1.2", "0.9223372036854775807.00", "00000.0.0a0a"} {
		f.Add(s, 4)
	}
	f.Fuzz(func(t *testing.T, c string, tables int) {
		if tables < 1 || tables > 1024 {
			return
		}
		ti, h, ts, err := parseCursor(c, tables)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("parseCursor(%q) = %v, want ErrInvalidArgument", c, err)
			}
			return
		}
		if ti < 0 || ti >= tables || h == nil {
			t.Fatalf("parseCursor(%q) = table %d of %d, hash %x", c, ti, tables, h)
		}
		if c == "" {
			return
		}
		again := fmt.Sprintf("%d.%d.%x", ti, ts.UnixMicro(), h)
		if ts.Equal(time.Unix(-62135596800, 0)) {
			again = fmt.Sprintf("%d.0.%x", ti, h)
		}
		ti2, h2, ts2, err := parseCursor(again, tables)
		if err != nil || ti2 != ti || string(h2) != string(h) || !ts2.Equal(ts) {
			t.Fatalf("%q -> %q -> (%d, %x, %s, %v)", c, again, ti2, h2, ts2, err)
		}
	})
}
