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
			if pw, others := urlPassword(raw); len(pw) >= 6 && strings.Contains(err.Error(), pw) && !strings.Contains(others, pw) {
				t.Fatalf("FromURL(%q): error shows the password: %v", raw, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("FromURL(%q) accepted a configuration Validate refuses: %v", raw, err)
		}
	})
}

// urlPassword returns the password of raw's userinfo as written (the
// authority runs to the first '/', '?' or '#'; the userinfo to its last
// '@', as net/url reads it) and raw without it. An error may quote the
// other parts of the URL: where they hold the password's text too
// ("mysql://:p%40ss@/p%40ss/", a database named like the password), its
// presence in an error tells nothing.
func urlPassword(raw string) (pw, others string) {
	i := strings.Index(raw, "://")
	if i < 0 {
		return "", raw
	}
	start := i + 3
	auth := raw[start:]
	if end := strings.IndexAny(auth, "/?#"); end >= 0 {
		auth = auth[:end]
	}
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		return "", raw
	}
	k := strings.Index(auth[:at], ":")
	if k < 0 {
		return "", raw
	}
	pwStart := start + k + 1
	pw = auth[k+1 : at]
	return pw, raw[:pwStart] + raw[pwStart+len(pw):]
}
