package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDemoExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"demo", "-db", filepath.Join(dir, "d.db"), "-messages", "2000", "-crashes", "20", "-workers", "16", "-seed", "42"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "0 missing, 0 applied more than once") {
		t.Fatalf("output:\n%s", out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "d.db")); err != nil {
		t.Fatalf("store file: %v", err)
	}
}

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
		{[]string{"help"}, 0, ""},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("run(%q) = %d, stderr %q; want %d containing %q", tc.args, code, errb.String(), tc.code, tc.msg)
		}
	}
}
