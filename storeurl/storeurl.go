// Package storeurl reads the query parameters of a store URL
// (postgres://...?namespace=orders&layout=sharded). Each store module's
// FromURL uses it so that every store spells, checks and reports its
// settings the same way: a parameter given twice, with a bad value or
// unknown to both the store and its driver is an error that names it and
// wraps idem.ErrInvalidArgument.
//
// Parameters a store takes are removed; what remains (Rest) is handed to
// the store's driver (pgx, go-redis, go-sql-driver/mysql), which rejects or
// interprets it as it documents.
package storeurl

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/keytime"
)

// Params is the query of a store URL, consumed parameter by parameter.
// The zero value is not usable: call Parse or FromQuery.
type Params struct {
	store string // "pgstore", ... for error messages
	q     url.Values
	err   error
}

// Parse parses raw, checks that its scheme is one of schemes (compared
// without case) and returns the URL and its query parameters. store names
// the caller in errors ("pgstore").
func Parse(store, raw string, schemes ...string) (*url.URL, *Params, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Error repeats the URL, which may hold a password.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, nil, fmt.Errorf("%w: %s: bad URL: %v", idem.ErrInvalidArgument, store, err)
	}
	ok := false
	for _, s := range schemes {
		if strings.EqualFold(u.Scheme, s) {
			ok = true
		}
	}
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s: URL scheme %q: want %s", idem.ErrInvalidArgument, store, u.Scheme, strings.Join(quote(schemes), " or "))
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: bad URL query: %v", idem.ErrInvalidArgument, store, err)
	}
	return u, &Params{store: store, q: q}, nil
}

func quote(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s + "://")
	}
	return out
}

// FromQuery wraps an already parsed query.
func FromQuery(store string, q url.Values) *Params { return &Params{store: store, q: q} }

func (p *Params) fail(name, val, format string, a ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: %s: URL parameter %s=%q: %s", idem.ErrInvalidArgument, p.store, name, val, fmt.Sprintf(format, a...))
	}
}

// take removes name and returns its value; ok is false when it is absent.
func (p *Params) take(name string) (string, bool) {
	vs, ok := p.q[name]
	if !ok {
		return "", false
	}
	delete(p.q, name)
	if len(vs) != 1 {
		p.fail(name, strings.Join(vs, ","), "given %d times", len(vs))
		return "", false
	}
	return vs[0], true
}

// String sets *dst to the parameter's value when it is present.
func (p *Params) String(name string, dst *string) {
	if v, ok := p.take(name); ok {
		*dst = v
	}
}

// Strings removes every value of a parameter that may repeat.
func (p *Params) Strings(name string) []string {
	vs := p.q[name]
	delete(p.q, name)
	return vs
}

// Int sets *dst to the parameter as a decimal integer in [min, max].
func (p *Params) Int(name string, dst *int, min, max int) {
	v, ok := p.take(name)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		p.fail(name, v, "not an integer")
		return
	}
	if n < min || n > max {
		p.fail(name, v, "outside [%d, %d]", min, max)
		return
	}
	*dst = n
}

// Duration sets *dst to the parameter as a Go duration ("500ms", "2s").
func (p *Params) Duration(name string, dst *time.Duration) {
	v, ok := p.take(name)
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		p.fail(name, v, "not a duration (e.g. 500ms, 2s, 1h)")
		return
	}
	if d < 0 {
		p.fail(name, v, "negative")
		return
	}
	*dst = d
}

// Bool sets *dst to the parameter: true, false, 1 or 0; a parameter with
// no value (?archive) is true.
func (p *Params) Bool(name string, dst *bool) {
	v, ok := p.take(name)
	if !ok {
		return
	}
	switch strings.ToLower(v) {
	case "", "true", "1", "yes", "on":
		*dst = true
	case "false", "0", "no", "off":
		*dst = false
	default:
		p.fail(name, v, "want true or false")
	}
}

// Choice sets *dst to the parameter, which must be one of choices.
func (p *Params) Choice(name string, dst *string, choices ...string) {
	v, ok := p.take(name)
	if !ok {
		return
	}
	for _, c := range choices {
		if v == c {
			*dst = v
			return
		}
	}
	p.fail(name, v, "want one of %s", strings.Join(choices, ", "))
}

// Period sets *dst from a partition width parameter: day (24h) or week
// (168h), the periods of the SQL stores' time-partitioned layout.
func (p *Params) Period(name string, dst *time.Duration) {
	var v string
	p.Choice(name, &v, "day", "week")
	switch v {
	case "day":
		*dst = 24 * time.Hour
	case "week":
		*dst = 7 * 24 * time.Hour
	}
}

// Rest returns the parameters not taken, for the driver.
func (p *Params) Rest() url.Values { return p.q }

// Err is the first error met, if any.
func (p *Params) Err() error { return p.err }

// Done returns the first error met or, when no driver takes the rest,
// an error naming the parameters left over (unknown to the store).
func (p *Params) Done() error {
	if p.err != nil {
		return p.err
	}
	if len(p.q) > 0 {
		names := make([]string, 0, len(p.q))
		for n := range p.q {
			names = append(names, n)
		}
		slices.Sort(names)
		return fmt.Errorf("%w: %s: unknown URL parameter(s) %s", idem.ErrInvalidArgument, p.store, strings.Join(names, ", "))
	}
	return nil
}

// KeyTime reads the keytime parameter (uuidv7, ulid or snowflake) and,
// for snowflake, snowflake_epoch (RFC 3339; default 2020-01-01T00:00:00Z,
// the snowflake package's default epoch): the key time reader of the SQL
// stores' time-ordered layouts. It returns nil when keytime is absent.
func (p *Params) KeyTime() keytime.Func {
	var kt, epoch string
	p.Choice("keytime", &kt, "uuidv7", "ulid", "snowflake")
	p.String("snowflake_epoch", &epoch)
	if p.err != nil {
		return nil
	}
	if epoch != "" && kt != "snowflake" {
		p.fail("snowflake_epoch", epoch, "needs keytime=snowflake")
		return nil
	}
	switch kt {
	case "uuidv7":
		return keytime.UUIDv7
	case "ulid":
		return keytime.ULID
	case "snowflake":
		ep := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
		if epoch != "" {
			t, err := time.Parse(time.RFC3339Nano, epoch)
			if err != nil {
				p.fail("snowflake_epoch", epoch, "want RFC 3339 (2020-01-01T00:00:00Z)")
				return nil
			}
			ep = t
		}
		return keytime.Snowflake(ep)
	}
	return nil
}
