// Command idem is idem's command-line tool. Today it has one subcommand,
// demo, which shows the guard at work on the embedded file store with no
// server to set up; the HTTP service (serve), the proxy and the benchmark
// harness will join it.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "demo":
		return demo(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "idem: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: idem <command> [flags]

commands:
  demo    deliver messages at least once (duplicates, redeliveries, crashed
          workers, a restart) through the guard on the embedded file store,
          and check every effect happened exactly once

run "idem <command> -h" for a command's flags
`)
}
