package memstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/memstore"
)

func TestFromURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want memstore.Config
		err  string
	}{
		{url: "memory://"},
		{url: "memory:"},
		{url: "memory:///"},
		{url: "memory://?namespace=a.b&max_entries=10&shards=4&sweep_interval=5ms", want: memstore.Config{Namespace: "a.b", MaxEntries: 10, Shards: 4, SweepInterval: 5 * time.Millisecond}},
		{url: "memory://host", err: "no host"},
		{url: "memory:///path", err: "no host"},
		{url: "mem://", err: `scheme "mem"`},
		{url: "memory://?shards=0", err: "shards"},
		{url: "memory://?max_entries=-1", err: "max_entries"},
		{url: "memory://?sweep=1s", err: "unknown URL parameter(s) sweep"},
		{url: "memory://?namespace=%2F", err: "namespace"},
	} {
		got, err := memstore.FromURL(tc.url)
		if tc.err != "" {
			if err == nil || !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("FromURL(%q) = %v; want ErrInvalidArgument containing %q", tc.url, err, tc.err)
			}
			continue
		}
		if err != nil || got.Namespace != tc.want.Namespace || got.MaxEntries != tc.want.MaxEntries || got.Shards != tc.want.Shards || got.SweepInterval != tc.want.SweepInterval {
			t.Errorf("FromURL(%q) = %+v, %v; want %+v", tc.url, got, err, tc.want)
		}
	}
}
