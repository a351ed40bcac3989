// Command idem is idem's command-line tool: the demo, the HTTP API (serve),
// the Idempotency-Key proxy (proxy) and the operations commands (inspect,
// keys, evict, release, gc, migrate, stats, id) on any store named by a URL. Other commands add themselves to the tree from
// their own files (see subcommands in root.go).
//
// Every command takes --store URL (env IDEM_STORE; default the embedded file
// store idem.db in the working directory) and --namespace NS (env
// IDEM_NAMESPACE), and --json for machine-readable output. Exit codes are
// listed in exitcodes.go and docs/cli.md.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	asJSON := false
	if f := root.PersistentFlags().Lookup("json"); f != nil {
		asJSON = f.Value.String() == "true"
	}
	return report(err, stderr, asJSON)
}
