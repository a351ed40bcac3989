package mysqlstore

import (
	"database/sql"
	"errors"
	"regexp"
	"testing"

	"github.com/idem-dev/idem"
)

// Any cursor string either parses into integer and hex literals only, or is
// rejected with ErrInvalidArgument before any SQL is built.
func FuzzParseCursor(f *testing.F) {
	for _, s := range []string{"", "0.1795910400000000.00112233445566778899aabbccddeeff", "3.1.2.00112233445566778899aabbccddeeff", "x", "0.1.zz", "0.1.00'; DROP TABLE x; --"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	safe := regexp.MustCompile(`^(-?[0-9]+,)*X'[0-9a-f]{32}'$`)
	f.Fuzz(func(t *testing.T, cursor string, timed bool) {
		cfg := Config{DB: &sql.DB{}, Layout: LayoutSharded, Shards: 4}
		if timed {
			cfg = Config{DB: &sql.DB{}, Layout: LayoutTimeOrdered, KeyTime: UUIDv7KeyTime}
		}
		c := cfg.withDefaults()
		s := &Store{cfg: c, n: namesOf(c)}
		ti, lits, err := s.parseCursor(cursor)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("cursor %q: %v", cursor, err)
			}
			return
		}
		if cursor == "" {
			return
		}
		if ti < 0 || ti >= len(s.n.tables) || !safe.MatchString(lits) {
			t.Fatalf("cursor %q parsed to table %d, literals %q", cursor, ti, lits)
		}
	})
}

func FuzzHexLit(f *testing.F) {
	f.Add([]byte("key"))
	f.Add([]byte{0, '\'', '\\', 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := hexStr(b)
		if !regexp.MustCompile(`^X'([0-9a-f]{2})*'$`).MatchString(s) || len(s) != 2*len(b)+3 {
			t.Fatalf("hexStr(%q) = %q", b, s)
		}
	})
}
