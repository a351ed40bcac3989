package crashplan

import (
	"fmt"
	"sort"
	"strings"
	"testing"
)

// FuzzCrashPlan: IDEM_CHAOS_CRASH is parsed or refused with a clear
// error, never half-applied; what parses prints back to the same plan.
func FuzzCrashPlan(f *testing.F) {
	for _, s := range []string{"", "after-claim@1", "after-effect@17,after-complete@3", "after-publish@0", "nope@1", "after-claim", "after-claim@x", ",,", "after-claim@99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		plan, err := Parse(s)
		if err != nil {
			if plan != nil || !strings.Contains(err.Error(), Env) {
				t.Fatalf("Parse(%q) = %v, %v", s, plan, err)
			}
			return
		}
		var parts []string
		for p, n := range plan {
			if _, ok := Codes[p]; !ok || n < 1 {
				t.Fatalf("Parse(%q) has %s@%d", s, p, n)
			}
			parts = append(parts, fmt.Sprintf("%s@%d", p, n))
		}
		sort.Strings(parts)
		again, err := Parse(strings.Join(parts, ","))
		if err != nil || len(again) != len(plan) {
			t.Fatalf("%q -> %v -> %v, %v", s, plan, again, err)
		}
		for p, n := range plan {
			if again[p] != n {
				t.Fatalf("%q -> %v -> %v", s, plan, again)
			}
		}
	})
}

func TestCrashPlan(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]int64
		err  bool
	}{
		{"", map[string]int64{}, false},
		{"after-claim@3", map[string]int64{AfterClaim: 3}, false},
		{" after-effect@1 , after-publish@2 ", map[string]int64{AfterEffect: 1, AfterPublish: 2}, false},
		{"after-claim@0", nil, true},
		{"after-claim@-1", nil, true},
		{"after-claim", nil, true},
		{"before-claim@1", nil, true},
		{"after-claim@1x", nil, true},
	} {
		got, err := Parse(tc.in)
		if (err != nil) != tc.err || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
