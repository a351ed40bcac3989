package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestCLIErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{nil, 2, "Usage:"},
		{[]string{"--bogus"}, 2, "unknown flag: --bogus"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"demo", "-messages", "0"}, 2, "-messages 0"},
		{[]string{"demo", "-dup", "-1"}, 2, "-dup"},
		{[]string{"demo", "-workers", "0"}, 2, "-workers"},
		{[]string{"demo", "-nope"}, 2, "flag provided but not defined"},
		{[]string{"demo", "-lost-acks", "0.9"}, 2, "-lost-acks"},
		{[]string{"demo", "extra"}, 2, "unexpected argument"},
		{[]string{"help"}, 0, ""},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("run(%q) = %d, stderr %q; want %d containing %q", tc.args, code, errb.String(), tc.code, tc.msg)
		}
	}
}
