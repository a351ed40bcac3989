package natsbroker

import "testing"

func TestServerVersions(t *testing.T) {
	for _, tc := range []struct {
		have              string
		accepted, reasons bool // >= MinServerVersion, >= termReasonVersion
	}{
		{"2.9.10", true, false}, // Debian 12's server: plain +TERM
		{"2.9.0", true, false},
		{"2.8.4", false, false},
		{"2.10.3", true, false},
		{"2.10.4", true, true},
		{"v2.10.4", true, true},
		{"2.11.0-RC.1", true, true},
		{"2.15.3", true, true},
		{"3.0.0", true, true},
		{"1.99.99", false, false},
		{"", false, false}, // not connected: plain +TERM, which every server honours
		{"2.10", false, false},
		{"two.ten.four", false, false},
	} {
		if got := atLeast(tc.have, MinServerVersion); got != tc.accepted {
			t.Errorf("atLeast(%q, MinServerVersion) = %v, want %v", tc.have, got, tc.accepted)
		}
		if got := atLeast(tc.have, termReasonVersion); got != tc.reasons {
			t.Errorf("atLeast(%q, termReasonVersion) = %v, want %v", tc.have, got, tc.reasons)
		}
	}
}
