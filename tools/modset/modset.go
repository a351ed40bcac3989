// Package modset works on idem's set of Go modules as a release sees them:
// the modules listed in go.work, their requirements on each other, and the
// module zips and checksums a module proxy would serve for them at a
// version. scripts/release uses it to prepare a release commit, and
// TestOfflineProxy uses it to build a file-based module proxy from the
// tree and install from it as a user outside the repository would.
package modset

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// Prefix is the module path every module of the repository starts with.
const Prefix = "github.com/idem-dev/idem"

// Module is one module of the set.
type Module struct {
	Dir  string // relative to the repository root, slash-separated; "." for the root
	Path string // module path
}

// Tag is the git tag of the module at version: module-path-prefixed for
// modules in subdirectories ("pgstore/v0.3.0"), the bare version for the
// root module.
func (m Module) Tag(version string) string {
	if m.Dir == "." {
		return version
	}
	return m.Dir + "/" + version
}

// Set is the repository's modules and the files each one holds.
type Set struct {
	Root    string
	Modules []Module
	// files of each module (by Dir), relative to the module's directory,
	// slash-separated, sorted: the repository's files (tracked, or not
	// ignored) outside nested modules.
	files map[string][]string
}

// IsSibling reports whether path is a module of the repository.
func IsSibling(path string) bool { return path == Prefix || strings.HasPrefix(path, Prefix+"/") }

// Load reads go.work at root and lists the files of each module with git
// (tracked files and untracked ones that are not ignored).
func Load(root string) (*Set, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	s := &Set{Root: root, files: map[string][]string{}}
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		gm, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(dir), "go.mod"))
		if err != nil {
			return nil, err
		}
		p := modfile.ModulePath(gm)
		if !IsSibling(p) {
			return nil, fmt.Errorf("modset: %s/go.mod: module %q is not under %s", dir, p, Prefix)
		}
		s.Modules = append(s.Modules, Module{Dir: dir, Path: p})
	}
	out, err := git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	// Each file belongs to the innermost module directory holding it.
	dirs := make([]string, 0, len(s.Modules))
	for _, m := range s.Modules {
		dirs = append(dirs, m.Dir)
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); err != nil {
			continue // deleted in the work tree
		}
		for _, d := range dirs {
			if d == "." {
				s.files["."] = append(s.files["."], f)
				break
			}
			if rel, ok := strings.CutPrefix(f, d+"/"); ok {
				s.files[d] = append(s.files[d], rel)
				break
			}
		}
	}
	for d, fs := range s.files {
		s.files[d] = withoutNested(fs)
	}
	return s, nil
}

// withoutNested drops the files of directories below the module root that
// hold a go.mod of their own (modules go.work does not list, such as
// testdata): like the go command, a module zip leaves them out.
func withoutNested(files []string) []string {
	nested := map[string]bool{}
	for _, f := range files {
		if d := path.Dir(f); path.Base(f) == "go.mod" && d != "." {
			nested[d] = true
		}
	}
	var out []string
	for _, f := range files {
		keep := true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			if nested[d] {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

func (s *Set) abs(m Module, rel string) string {
	return filepath.Join(s.Root, filepath.FromSlash(m.Dir), filepath.FromSlash(rel))
}

func (s *Set) readMod(m Module) (*modfile.File, error) {
	p := s.abs(m, "go.mod")
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return modfile.Parse(p, data, nil)
}

// Check reports the ways the set breaks the rules a user outside the
// repository depends on: a replace directive of a sibling, or sibling
// requirements at different versions or at no release version.
func (s *Set) Check() error {
	var errs []error
	versions := map[string][]string{}
	for _, m := range s.Modules {
		f, err := s.readMod(m)
		if err != nil {
			return err
		}
		for _, r := range f.Replace {
			if IsSibling(r.Old.Path) {
				errs = append(errs, fmt.Errorf("%s/go.mod: replace %s: siblings come from go.work, not replace directives", m.Dir, r.Old.Path))
			}
		}
		for _, r := range f.Require {
			if IsSibling(r.Mod.Path) {
				versions[r.Mod.Version] = append(versions[r.Mod.Version], m.Dir+" -> "+r.Mod.Path)
			}
		}
	}
	if wd, err := os.ReadFile(filepath.Join(s.Root, "go.work")); err == nil {
		wf, err := modfile.ParseWork("go.work", wd, nil)
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, r := range wf.Replace {
			if IsSibling(r.Old.Path) {
				have[r.Old.Path+"@"+r.Old.Version] = true
			}
		}
		for v := range versions {
			for _, m := range s.Modules {
				if !have[m.Path+"@"+v] {
					errs = append(errs, fmt.Errorf("go.work has no replace %s %s => ./%s (scripts/release -requires %s writes it)", m.Path, v, m.Dir, v))
				}
			}
		}
	}
	if len(versions) > 1 {
		var vs []string
		for v, who := range versions {
			vs = append(vs, fmt.Sprintf("%s (%s)", v, strings.Join(who, ", ")))
		}
		sort.Strings(vs)
		errs = append(errs, fmt.Errorf("modules require their siblings at different versions: %s", strings.Join(vs, "; ")))
	}
	for v, who := range versions {
		if !semver.IsValid(v) || v == "v0.0.0" || module.IsPseudoVersion(v) {
			errs = append(errs, fmt.Errorf("sibling requirement %s is not a release version (%s)", v, strings.Join(who, ", ")))
		}
	}
	return errors.Join(errs...)
}

// Rewrite sets every requirement of a sibling to version and drops any
// replace directive of a sibling, in every module's go.mod.
func (s *Set) Rewrite(version string) error {
	if err := checkVersion(version); err != nil {
		return err
	}
	for _, m := range s.Modules {
		f, err := s.readMod(m)
		if err != nil {
			return err
		}
		for _, r := range f.Require {
			if IsSibling(r.Mod.Path) {
				if err := f.AddRequire(r.Mod.Path, version); err != nil {
					return err
				}
			}
		}
		for _, r := range slices.Clone(f.Replace) {
			if IsSibling(r.Old.Path) {
				if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return err
				}
			}
		}
		f.Cleanup()
		out, err := f.Format()
		if err != nil {
			return err
		}
		if err := os.WriteFile(s.abs(m, "go.mod"), out, 0o644); err != nil {
			return err
		}
	}
	return s.rewriteWork(version)
}

// rewriteWork points go.work's replace directives for the siblings at
// version to their directories. The go command reads the go.mod of a
// workspace module at the version another module requires when it loads
// the full module graph (any dependency without graph pruning makes it do
// so), and that version is not on any proxy until it is released: the
// replace keeps the workspace offline. Only go.work has them; go.mod files
// never do.
func (s *Set) rewriteWork(version string) error {
	p := filepath.Join(s.Root, "go.work")
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	wf, err := modfile.ParseWork(p, data, nil)
	if err != nil {
		return err
	}
	for _, r := range slices.Clone(wf.Replace) {
		if IsSibling(r.Old.Path) {
			if err := wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	for _, m := range s.Modules {
		dir := "./" + m.Dir
		if m.Dir == "." {
			dir = "./"
		}
		if err := wf.AddReplace(m.Path, version, dir, ""); err != nil {
			return err
		}
	}
	wf.Cleanup()
	return os.WriteFile(p, modfile.Format(wf.Syntax), 0o644)
}

func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("modset: version %q: want vMAJOR.MINOR.PATCH[-pre]", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("modset: version %s: a major version above v1 needs /%s module paths", v, m)
	}
	return nil
}

// siblingReqs returns the siblings m requires directly.
func (s *Set) siblingReqs(m Module) ([]string, error) {
	f, err := s.readMod(m)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range f.Require {
		if IsSibling(r.Mod.Path) {
			out = append(out, r.Mod.Path)
		}
	}
	return out, nil
}

func (s *Set) byPath(p string) (Module, bool) {
	for _, m := range s.Modules {
		if m.Path == p {
			return m, true
		}
	}
	return Module{}, false
}

// order returns the modules with every module after the siblings it
// requires, and each module's transitive sibling requirements.
func (s *Set) order() ([]Module, map[string][]string, error) {
	reach := map[string][]string{}
	state := map[string]int{} // 1 visiting, 2 done
	var out []Module
	var visit func(m Module) error
	visit = func(m Module) error {
		switch state[m.Path] {
		case 1:
			return fmt.Errorf("modset: requirement cycle through %s", m.Path)
		case 2:
			return nil
		}
		state[m.Path] = 1
		reqs, err := s.siblingReqs(m)
		if err != nil {
			return err
		}
		set := map[string]bool{}
		for _, r := range reqs {
			dep, ok := s.byPath(r)
			if !ok {
				return fmt.Errorf("modset: %s requires %s, which go.work does not list", m.Path, r)
			}
			if err := visit(dep); err != nil {
				return err
			}
			set[r] = true
			for _, t := range reach[r] {
				set[t] = true
			}
		}
		for p := range set {
			reach[m.Path] = append(reach[m.Path], p)
		}
		sort.Strings(reach[m.Path])
		state[m.Path] = 2
		out = append(out, m)
		return nil
	}
	for _, m := range s.Modules {
		if err := visit(m); err != nil {
			return nil, nil, err
		}
	}
	return out, reach, nil
}

// Sums writes into each module's go.sum the checksums of the siblings it
// needs at version (every sibling it requires, directly or not: the zip's
// h1 and the go.mod's), replacing any earlier sibling lines, so that a
// module built from a proxy (go install .../cmd/idem@version) verifies its
// siblings like any dependency. Modules are done dependencies first, since a
// module's zip holds its go.sum. Run it after Rewrite.
func (s *Set) Sums(version string) error {
	mods, reach, err := s.order()
	if err != nil {
		return err
	}
	sums := map[string][2]string{} // path -> zip hash, go.mod hash
	for _, m := range mods {
		var lines []string
		for _, dep := range reach[m.Path] {
			h := sums[dep]
			lines = append(lines, fmt.Sprintf("%s %s %s", dep, version, h[0]), fmt.Sprintf("%s %s/go.mod %s", dep, version, h[1]))
		}
		if err := s.rewriteSum(m, lines); err != nil {
			return err
		}
		zh, mh, err := s.hashes(m, version)
		if err != nil {
			return err
		}
		sums[m.Path] = [2]string{zh, mh}
	}
	return nil
}

func (s *Set) rewriteSum(m Module, add []string) error {
	p := s.abs(m, "go.sum")
	data, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var keep []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if f := strings.Fields(l); len(f) == 3 && !IsSibling(f[0]) {
			keep = append(keep, l)
		}
	}
	all := append(keep, add...)
	sort.Strings(all)
	all = slices.Compact(all)
	if len(all) == 0 {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return os.Remove(p)
	}
	hadFile := err == nil
	if err := os.WriteFile(p, []byte(strings.Join(all, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if !hadFile {
		s.files[m.Dir] = append(s.files[m.Dir], "go.sum")
		sort.Strings(s.files[m.Dir])
	}
	return nil
}

// zipFile is a file of a module for modzip.Create.
type zipFile struct{ rel, abs string }

func (f zipFile) Path() string                 { return f.rel }
func (f zipFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f zipFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

// WriteZip writes the module zip of m at version, as a proxy serves it.
func (s *Set) WriteZip(w io.Writer, m Module, version string) error {
	var files []modzip.File
	for _, rel := range s.files[m.Dir] {
		files = append(files, zipFile{rel: rel, abs: s.abs(m, rel)})
	}
	return modzip.Create(w, module.Version{Path: m.Path, Version: version}, files)
}

// hashes returns the go.sum hashes of m at version: of its zip and of its
// go.mod.
func (s *Set) hashes(m Module, version string) (string, string, error) {
	f, err := os.CreateTemp("", "modset-*.zip")
	if err != nil {
		return "", "", err
	}
	defer os.Remove(f.Name())
	err = s.WriteZip(f, m, version)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", "", fmt.Errorf("modset: zip %s: %w", m.Path, err)
	}
	zh, err := dirhash.HashZip(f.Name(), dirhash.Hash1)
	if err != nil {
		return "", "", err
	}
	mh, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) { return os.Open(s.abs(m, "go.mod")) })
	if err != nil {
		return "", "", err
	}
	return zh, mh, nil
}

// WriteProxy writes every module at version into dir laid out as a module
// proxy (GOPROXY=file://dir): <path>/@v/list, <version>.info, .mod, .zip.
func (s *Set) WriteProxy(dir, version string, at time.Time) error {
	for _, m := range s.Modules {
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return err
		}
		gm, err := os.ReadFile(s.abs(m, "go.mod"))
		if err != nil {
			return err
		}
		info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, at.UTC().Format(time.RFC3339))
		for name, data := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": []byte(info), version + ".mod": gm} {
			if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
				return err
			}
		}
		zf, err := os.Create(filepath.Join(vdir, version+".zip"))
		if err != nil {
			return err
		}
		err = s.WriteZip(zf, m, version)
		if cerr := zf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("modset: zip %s: %w", m.Path, err)
		}
	}
	return nil
}

// CopyTo copies the set's files to dir (a fresh tree holding only what a
// module proxy would see) and returns the set rooted there.
func (s *Set) CopyTo(dir string) (*Set, error) {
	c := &Set{Root: dir, Modules: s.Modules, files: map[string][]string{}}
	for _, m := range s.Modules {
		c.files[m.Dir] = slices.Clone(s.files[m.Dir])
		for _, rel := range s.files[m.Dir] {
			src, dst := s.abs(m, rel), c.abs(m, rel)
			data, err := os.ReadFile(src)
			if err != nil {
				return nil, err
			}
			fi, err := os.Lstat(src)
			if err != nil {
				return nil, err
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
				return nil, err
			}
		}
	}
	for _, f := range []string{"go.work"} {
		data, err := os.ReadFile(filepath.Join(s.Root, f))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			return nil, err
		}
	}
	return c, nil
}
