package tools_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/tools/modset"
)

// testVersion is the version the test releases the tree at. It is never
// tagged; it only has to be a release version.
const testVersion = "v0.99.0"

// goCmd runs the go command in dir with env added to a cleaned environment
// and returns its combined output.
func goCmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestModulesRequireReleasedSiblings: no go.mod of the tree has a replace
// directive of a sibling, and all require their siblings at one release
// version (what a user's go get resolves; go.work ties the tree locally).
func TestModulesRequireReleasedSiblings(t *testing.T) {
	set, err := modset.Load("..")
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestOfflineProxy releases the tree at testVersion into a file-based module
// proxy (module zips made with golang.org/x/mod/zip after the same rewrite
// scripts/release does), then, in a fresh module outside the tree with no
// network (GOPROXY: that proxy, then download directories of local module
// caches for third-party modules; no checksum database; an empty module
// cache), a user goes get the core, pgstore and natsbroker by version and
// builds a program on them, and go installs cmd/idem@testVersion and runs it.
// The user's go.mod must require none of the test-only modules.
func TestOfflineProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three programs from a fresh module cache")
	}
	set, err := modset.Load("..")
	if err != nil {
		t.Fatal(err)
	}
	tree, proxy, user, bin, cache := t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir(), t.TempDir()
	c, err := set.CopyTo(tree)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Rewrite(testVersion); err != nil {
		t.Fatal(err)
	}
	if err := c.Sums(testVersion); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteProxy(proxy, testVersion, time.Now()); err != nil {
		t.Fatal(err)
	}

	// The third-party modules the user's commands need come from module
	// caches of this machine: the one the workspace builds with (what
	// go install needs: the packages cmd/idem imports on this platform),
	// and one filled by the user's go get and go mod tidy run here first,
	// which may download what the first lacks (tidy loads every build tag
	// and the tests of dependencies: zips that no build here needs). This
	// step may use the network; nothing after it can.
	goCmd(t, "..", nil, "list", "-deps", "./pgstore", "./natsbroker", "./cmd/idem")
	fill, fillUser := t.TempDir(), t.TempDir()
	machine := "file://" + filepath.ToSlash(filepath.Join(goEnv(t, "GOMODCACHE"), "cache", "download"))
	env := func(proxies, modcache, goflags string) []string {
		return []string{"GOPROXY=" + proxies, "GOSUMDB=off", "GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=", "GOFLAGS=" + goflags,
			"GOWORK=off", "GOTOOLCHAIN=local", "GOMODCACHE=" + modcache, "GOBIN=" + bin}
	}
	online := env("file://"+filepath.ToSlash(proxy)+","+machine+","+goEnv(t, "GOPROXY"), fill, "-mod=mod")
	// -trimpath: what is compiled from the empty module cache is cached by
	// content, not under that directory's name, so the next run of this
	// test does not compile every dependency again.
	offline := env("file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(fill, "cache", "download"))+","+machine,
		cache, "-mod=mod -trimpath")
	for _, mc := range []string{cache, fill} {
		t.Cleanup(func() {
			// A module cache is read-only: let go remove it.
			cmd := exec.Command("go", "clean", "-modcache")
			cmd.Env = append(os.Environ(), "GOMODCACHE="+mc)
			_ = cmd.Run()
		})
	}
	get := []string{"get", "github.com/idem-dev/idem@" + testVersion, "github.com/idem-dev/idem/pgstore@" + testVersion, "github.com/idem-dev/idem/natsbroker@" + testVersion}
	for _, dir := range []string{fillUser, user} {
		for name, data := range map[string]string{"go.mod": "module example.com/orders\n\ngo 1.26\n", "main.go": userMain} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	goCmd(t, fillUser, online, get...)
	goCmd(t, fillUser, online, "mod", "tidy")

	goCmd(t, user, offline, get...)
	goCmd(t, user, offline, "mod", "tidy")
	goCmd(t, user, offline, "build", "-o", filepath.Join(bin, "orders"), ".")
	out, err := exec.Command(filepath.Join(bin, "orders")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "completed sharded <nil> true" {
		t.Fatalf("the user's program: %v\n%s", err, out)
	}
	gomod, err := os.ReadFile(filepath.Join(user, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"github.com/idem-dev/idem " + testVersion, "github.com/idem-dev/idem/pgstore " + testVersion, "github.com/idem-dev/idem/natsbroker " + testVersion} {
		if !strings.Contains(string(gomod), want) {
			t.Errorf("user go.mod lacks %q:\n%s", want, gomod)
		}
	}
	// Test-only modules and their dependencies stay out of the user's
	// requirements (module graph pruning: they are requirements of pgstore
	// and natsbroker for their own tests only).
	for _, leak := range []string{"storetest", "outboxtest", "brokertest", "e2etest", "porcupine", "goleak", "nats-server", "kfake", "replace"} {
		if strings.Contains(string(gomod), leak) {
			t.Errorf("user go.mod mentions %s:\n%s", leak, gomod)
		}
	}

	// go install by version: no -mod=mod, so the installed module's own
	// go.sum must hold every checksum, its siblings' included.
	install := append(append([]string{}, offline...), "GOFLAGS=-trimpath")
	goCmd(t, user, install, "install", "github.com/idem-dev/idem/cmd/idem@"+testVersion)
	out, err = exec.Command(filepath.Join(bin, "idem"), "id", "parse", "4194316293").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "worker 3\tsequence 5") {
		t.Fatalf("installed idem: %v\n%s", err, out)
	}
	t.Logf("user go.mod:\n%s", gomod)
}

// userMain is the user's program, on the core, pgstore and natsbroker.
const userMain = `package main

import (
	"fmt"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/natsbroker"
	"github.com/idem-dev/idem/pgstore"
)

func main() {
	c, err := pgstore.FromURL("postgres://app@db.example/orders?layout=sharded")
	var sub natsbroker.SubscriberConfig
	fmt.Println(idem.StateCompleted, c.Store.Layout, err, sub.Stream == "")
}
`
