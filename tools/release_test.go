package tools_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/idem-dev/idem/tools/modset"
	"golang.org/x/mod/modfile"
)

func run(t *testing.T, dir string, wantErr bool, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if (err != nil) != wantErr {
		t.Fatalf("%s %s: err %v (want error: %v)\n%s", name, strings.Join(args, " "), err, wantErr, out)
	}
	return string(out)
}

// TestReleaseScript runs scripts/release on a clone of the repository:
// one commit, one tag per module of go.work (the root's bare, the others
// prefixed with their directory), every sibling required at the version
// with no replace directive, sibling checksums in go.sum, a clean tree;
// a second run and a dirty tree are refused.
func TestReleaseScript(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository")
	}
	root := strings.TrimSpace(run(t, "..", false, "git", "rev-parse", "--show-toplevel"))
	clone := filepath.Join(t.TempDir(), "idem")
	run(t, "", false, "git", "clone", "-q", "--no-hardlinks", root, clone)
	set, err := modset.Load(clone)
	if err != nil {
		t.Fatal(err)
	}
	const v = "v0.99.1"
	out := run(t, clone, false, "scripts/release", v)
	if !strings.Contains(out, "git push origin") {
		t.Fatalf("release printed:\n%s", out)
	}
	var want []string
	for _, m := range set.Modules {
		want = append(want, m.Tag(v))
	}
	sort.Strings(want)
	tags := strings.Fields(run(t, clone, false, "git", "tag", "--points-at", "HEAD"))
	sort.Strings(tags)
	if strings.Join(tags, " ") != strings.Join(want, " ") {
		t.Fatalf("tags at HEAD %v, want %v", tags, want)
	}
	if st := run(t, clone, false, "git", "status", "--porcelain"); st != "" {
		t.Fatalf("tree not clean after release:\n%s", st)
	}
	if msg := run(t, clone, false, "git", "log", "-1", "--format=%s"); !strings.HasPrefix(msg, "release "+v) {
		t.Fatalf("HEAD is %q", msg)
	}
	after, err := modset.Load(clone)
	if err != nil {
		t.Fatal(err)
	}
	if err := after.Check(); err != nil {
		t.Fatal(err)
	}
	for _, m := range after.Modules {
		data, err := os.ReadFile(filepath.Join(clone, m.Dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.Parse("go.mod", data, nil)
		if err != nil {
			t.Fatal(err)
		}
		sum, _ := os.ReadFile(filepath.Join(clone, m.Dir, "go.sum"))
		for _, r := range f.Require {
			if !modset.IsSibling(r.Mod.Path) {
				continue
			}
			if r.Mod.Version != v {
				t.Errorf("%s requires %s %s", m.Dir, r.Mod.Path, r.Mod.Version)
			}
			for _, line := range []string{r.Mod.Path + " " + v + " h1:", r.Mod.Path + " " + v + "/go.mod h1:"} {
				if !strings.Contains(string(sum), line) {
					t.Errorf("%s/go.sum lacks %q", m.Dir, line)
				}
			}
		}
	}
	if out := run(t, clone, true, "scripts/release", v); !strings.Contains(out, "exists") {
		t.Fatalf("second release: %s", out)
	}
	if err := os.WriteFile(filepath.Join(clone, "stray.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := run(t, clone, true, "scripts/release", "v0.99.2"); !strings.Contains(out, "work tree has changes") {
		t.Fatalf("release of a dirty tree: %s", out)
	}
}
