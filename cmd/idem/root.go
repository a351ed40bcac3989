package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// globals are the flags every command shares (persistent on the root).
type globals struct {
	store     string
	namespace string
	json      bool
	timeout   time.Duration
	stdout    io.Writer
	stderr    io.Writer
}

// defaultStore is the embedded file store in the working directory.
const defaultStore = "bolt:idem.db"

// envAnnotation names a flag's environment variable (see bindEnv).
const envAnnotation = "idem_env"

// bindEnv makes flag name of fs default to the environment variable env
// when it is not given on the command line, and says so in its usage.
// Commands added to the root (serve, proxy) use it for their own flags; the
// root's PersistentPreRunE applies it (before any hook of the subcommand's:
// cobra.EnableTraverseRunHooks).
func bindEnv(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("bindEnv: no flag " + name)
	}
	f.Usage += " [$" + env + "]"
	if f.Annotations == nil {
		f.Annotations = map[string][]string{}
	}
	f.Annotations[envAnnotation] = []string{env}
}

// applyEnv sets every flag of cmd not given on the command line from its
// environment variable, if that is set.
func applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		env := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(env) == 0 {
			return
		}
		v, ok := os.LookupEnv(env[0])
		if !ok {
			return
		}
		if sv, isSlice := f.Value.(pflag.SliceValue); isSlice {
			// A list in one variable: comma-separated, like the repeated flag.
			err = sv.Replace(strings.Split(v, ","))
		} else {
			err = f.Value.Set(v)
		}
		if err != nil {
			err = usageError("$%s=%q: %v", env[0], v, err)
		}
	})
	return err
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	// Every command's persistent pre-run hooks run, the root's first (it
	// reads the environment), even when a subcommand has its own.
	cobra.EnableTraverseRunHooks = true
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "idem",
		Short: "exactly-once effects over at-least-once brokers: demo and operations on any store",
		Long: `idem: exactly-once effects over at-least-once brokers.

Every command works on the store named by --store (a URL; $IDEM_STORE; default
` + defaultStore + `, the embedded file store in the working directory):

  bolt:///abs/path.db, bolt:rel/path.db   embedded file store (boltstore)
  memory://                               in-process memory (memstore; serve only)
  redis://, rediss://, redis+cluster://   Redis, TLS, Redis Cluster (redisstore)
  postgres://, postgresql://              PostgreSQL (pgstore)
  mysql://                                MariaDB/MySQL (mysqlstore)

and on the namespace --namespace ($IDEM_NAMESPACE, default ""). See docs/cli.md
for each store's URL parameters and the exit codes.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// A bare "idem" or an unknown command is a usage error (exit 2).
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError("unknown command %q (run idem --help)", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(stderr)
			cmd.Usage()
			return &exitErr{code: exitUsage, err: errSilent}
		},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error { return applyEnv(cmd) },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitErr{code: exitUsage, err: err} })
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVar(&g.store, "store", defaultStore, "store URL")
	pf.StringVar(&g.namespace, "namespace", "", "namespace of the keys")
	pf.BoolVar(&g.json, "json", false, "print JSON")
	pf.DurationVar(&g.timeout, "timeout", 30*time.Second, "give up on the store after this long (exit 3)")
	bindEnv(pf, "store", "IDEM_STORE")
	bindEnv(pf, "namespace", "IDEM_NAMESPACE")
	bindEnv(pf, "json", "IDEM_JSON")
	bindEnv(pf, "timeout", "IDEM_TIMEOUT")

	root.AddCommand(demoCmd(g))
	for _, add := range subcommands {
		root.AddCommand(add(g))
	}
	usageArgs(root)
	return root
}

// usageArgs makes every command's argument errors usage errors (exit 2),
// whatever validator it uses (cobra.NoArgs, cobra.ExactArgs...).
func usageArgs(c *cobra.Command) {
	if v := c.Args; v != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			err := v(cmd, args)
			var ee *exitErr
			if err != nil && !errors.As(err, &ee) {
				err = &exitErr{code: exitUsage, err: err}
			}
			return err
		}
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}

// subcommands are added to the root by the files that define them (in
// their init), so that each command lives in its own file.
var subcommands []func(*globals) *cobra.Command

// demoCmd keeps demo's own single-dash flags (-messages 2000): its flag set
// parses them.
func demoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:                "demo [flags]",
		Short:              "run the whole chain in process (outbox, embedded NATS JetStream, consumers, guard on the embedded file store) with duplicate publishes, lost acks and consumer crashes; every effect exactly once",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := demo(args, g.json, g.stdout, g.stderr); code != 0 {
				return &exitErr{code: code, err: errSilent}
			}
			return nil
		},
	}
}

// printJSON writes v as indented JSON on stdout.
func (g *globals) printf(format string, a ...any) { fmt.Fprintf(g.stdout, format, a...) }
