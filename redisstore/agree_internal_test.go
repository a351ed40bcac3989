package redisstore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// TestScriptAndDecoderAgree stores values the record decoder (parseRecord)
// accepts or refuses under a key and claims it: a value the decoder refuses
// must be refused by the claim script too (a per-key idem.ErrCorrupt, the value
// left as it was), and a value it accepts must be read as a record (never
// idem.ErrCorrupt). A script that took over a value the decoder cannot read
// would rewrite it from fields it misread.
func TestScriptAndDecoderAgree(t *testing.T) {
	c, prefix := sharedForInternal(t, "agree")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := New(ctx, Config{Client: c, Prefix: prefix, SkipChecks: true, NoCoalesce: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old := strconv.FormatInt(time.Now().Add(-time.Hour).UnixMilli(), 10)
	rel := func(fields string) string { // a released record with a lease long over
		return "3|r|" + fields + "|1|" + old + "|" + old + "|" + old + "|" + old + "|1000|7200000|3600000|"
	}
	for i, v := range []string{
		rel("1764450000000123") + "0|0|",
		"2|c|1764450000000200|2|" + old + "|60000|" + old + "|7200000|" + old + "|" + old + "|3600000|2|1|fpe",
		rel("1764450000000123") + "1|1|ab",  // lengths exactly to the end
		rel("1764450000000123") + "1|1|abc", // one result byte
		rel("1764450000000123") + "2|1|ab",  // lengths past the end
		rel("12345678901234567") + "0|0|",   // token of 17 digits
		rel("+5") + "0|0|",                  // signed number
		"3|x|5|1|" + old + "|" + old + "|" + old + "|" + old + "|1000|7200000|3600000|0|0|", // unknown state
		"4|p|1|1|1|1|1|1|1|1|1|0|0|", // unknown version
		rel("5") + "0|0",             // header one field short
		"garbage",
		"",
	} {
		key := []byte("k" + strconv.Itoa(i))
		rk, _ := s.keysOf(key)
		if err := c.Set(ctx, rk, v, 10*time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, decErr := parseRecord(key, v)
		cl, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Lease: time.Minute, TTL: time.Hour})
		if decErr != nil {
			if !errors.Is(err, idem.ErrCorrupt) {
				t.Errorf("%q: the decoder refuses it (%v) but the claim returned %v %v", v, decErr, cl.Outcome, err)
			}
			if got := c.Get(ctx, rk).Val(); got != v {
				t.Errorf("%q: rewritten as %q", v, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: the decoder reads it but the claim returned %v", v, err)
		}
	}
}
