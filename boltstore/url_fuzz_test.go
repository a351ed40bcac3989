package boltstore_test

import (
	"errors"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/boltstore"
)

// FuzzFromURL: any string gives a configuration that validates, naming a
// file, or an error wrapping idem.ErrInvalidArgument; never a panic.
func FuzzFromURL(f *testing.F) {
	for _, s := range []string{"bolt:///var/lib/idem.db", "bolt:idem.db", "bolt:data/my%20file.db?fsync=always&mode=0640", "bolt://h/x", "bolt:///x.db?skip_verify&lock_timeout=2s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := boltstore.FromURL(raw)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("FromURL(%q): %v does not wrap ErrInvalidArgument", raw, err)
			}
			return
		}
		if c.Path == "" || c.Validate() != nil {
			t.Fatalf("FromURL(%q) = %+v", raw, c)
		}
	})
}
