// Command release prepares and tags a release of every idem module at one
// version (scripts/release VERSION runs it from the repository root):
//
//  1. every go.mod requires its siblings at VERSION (no replace directives:
//     go.work ties the tree for development);
//  2. every go.sum gets the checksums of the siblings at VERSION, computed
//     from the module zips a proxy will serve for the tags, dependencies
//     first (a module's zip holds its go.sum), so go install
//     .../cmd/idem@VERSION verifies them like any dependency;
//  3. one commit "release VERSION", then an annotated tag per module:
//     VERSION for the root module, DIR/VERSION for the others
//     (pgstore/v0.3.0, cmd/idem/v0.3.0).
//
// It refuses a dirty work tree or an existing tag, and pushes nothing: it
// prints the push command. With -n it stops after step 2 and leaves the
// changes in the work tree for review. With -requires it only does the
// go.mod half of step 1 (for a module joining the tree between releases).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/idem-dev/idem/tools/modset"
)

func main() {
	dry := flag.Bool("n", false, "rewrite go.mod and go.sum files only: no commit, no tags")
	reqs := flag.Bool("requires", false, "only set every sibling requirement to VERSION and drop sibling replace directives (a new module joining the tree): no go.sum, no commit, no tags")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: scripts/release [-n] VERSION   (e.g. v0.3.0)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if *reqs {
		set, err := modset.Load(".")
		if err == nil {
			err = set.Rewrite(flag.Arg(0))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "release:", err)
			os.Exit(1)
		}
		return
	}
	if err := release(flag.Arg(0), *dry); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func release(version string, dry bool) error {
	root, err := git("rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	if st, err := git("status", "--porcelain"); err != nil {
		return err
	} else if st != "" {
		return fmt.Errorf("the work tree has changes; commit or stash them first:\n%s", st)
	}
	set, err := modset.Load(root)
	if err != nil {
		return err
	}
	var tags []string
	for _, m := range set.Modules {
		tag := m.Tag(version)
		if _, err := git("rev-parse", "-q", "--verify", "refs/tags/"+tag); err == nil {
			return fmt.Errorf("tag %s exists", tag)
		}
		tags = append(tags, tag)
	}
	if err := set.Rewrite(version); err != nil {
		return err
	}
	if err := set.Sums(version); err != nil {
		return err
	}
	if err := set.Check(); err != nil {
		return err
	}
	if dry {
		fmt.Println("go.mod and go.sum files rewritten for", version, "(see git diff); would tag:", strings.Join(tags, " "))
		return nil
	}
	if _, err := git("add", "-u", "--", "."); err != nil {
		return err
	}
	for _, m := range set.Modules {
		if _, err := os.Stat(m.Dir + "/go.sum"); err == nil {
			if _, err := git("add", "--", m.Dir+"/go.sum"); err != nil {
				return err
			}
		}
	}
	if st, _ := git("diff", "--cached", "--name-only"); st != "" {
		if _, err := git("commit", "-q", "-m", "release "+version+": every module requires its siblings at "+version); err != nil {
			return err
		}
	}
	for i, m := range set.Modules {
		if _, err := git("tag", "-a", tags[i], "-m", "idem "+m.Path+" "+version); err != nil {
			return err
		}
	}
	head, _ := git("rev-parse", "--short", "HEAD")
	fmt.Printf("tagged %s at %s:\n  %s\npush with:\n  git push origin %s\n", version, head, strings.Join(tags, "\n  "), strings.Join(tags, " "))
	return nil
}
