package mysqlstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/mysqlstore"
)

// FuzzFromURL: any string gives a configuration that validates or an
// error wrapping idem.ErrInvalidArgument, never a panic, and an error never
// shows the URL's password. Seeds in testdata/fuzz/FuzzFromURL.
func FuzzFromURL(f *testing.F) {
	for _, s := range []string{
		"mysql://root@127.0.0.1:3306/test",
		"mysql://u:p%40ss@h/db?tls=true&timeout=1s&namespace=n&layout=sharded&shards=4",
		"mysql://u@/db?socket=/run/mysqld/mysqld.sock",
		"mysql:///db?keytime=snowflake&snowflake_epoch=2021-01-01T00:00:00Z&layout=time_partitioned&period=week",
		"mysql://[::1]:3307/x?sql_mode=ANSI",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := mysqlstore.FromURL(raw)
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Fatalf("FromURL(%q): %v does not wrap ErrInvalidArgument", raw, err)
			}
			if i := strings.Index(raw, ":"); i >= 0 {
				if _, rest, ok := strings.Cut(raw[i+1:], "//"); ok {
					if user, _, ok := strings.Cut(rest, "@"); ok {
						if _, pw, ok := strings.Cut(user, ":"); ok && len(pw) >= 6 && strings.Contains(err.Error(), pw) {
							t.Fatalf("FromURL(%q): error shows the password: %v", raw, err)
						}
					}
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("FromURL(%q) accepted a configuration Validate refuses: %v", raw, err)
		}
	})
}
