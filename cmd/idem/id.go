package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-dev/idem/snowflake"
)

func init() { subcommands = append(subcommands, idCmd) }

// layoutFlags select a Snowflake layout (default: snowflake.DefaultLayout).
type layoutFlags struct {
	epoch                string
	timeB, workerB, seqB uint
}

func (l *layoutFlags) add(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&l.epoch, "epoch", snowflake.DefaultEpoch.Format(time.RFC3339), "epoch of the layout (RFC 3339)")
	cmd.PersistentFlags().UintVar(&l.timeB, "time-bits", snowflake.DefaultTimeBits, "bits of milliseconds since the epoch")
	cmd.PersistentFlags().UintVar(&l.workerB, "worker-bits", snowflake.DefaultWorkerBits, "bits of worker id")
	cmd.PersistentFlags().UintVar(&l.seqB, "sequence-bits", snowflake.DefaultSequenceBits, "bits of per-millisecond sequence")
}

func (l *layoutFlags) layout() (snowflake.Layout, error) {
	ep, err := time.Parse(time.RFC3339Nano, l.epoch)
	if err != nil {
		return snowflake.Layout{}, usageError("--epoch %q: want RFC 3339 (2020-01-01T00:00:00Z)", l.epoch)
	}
	lay := snowflake.Layout{Epoch: ep, TimeBits: l.timeB, WorkerBits: l.workerB, SequenceBits: l.seqB}
	if err := lay.Validate(); err != nil {
		return snowflake.Layout{}, &exitErr{code: exitUsage, err: err}
	}
	return lay, nil
}

func idCmd(g *globals) *cobra.Command {
	var lf layoutFlags
	cmd := &cobra.Command{
		Use:   "id",
		Short: "generate and parse Snowflake message ids",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError("id: give a subcommand: new or parse")
		},
	}
	lf.add(cmd)

	var count int
	var worker int64
	gen := &cobra.Command{
		Use:   "new",
		Short: "print new ids (worker --worker; keep it unique among live generators)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			lay, err := lf.layout()
			if err != nil {
				return err
			}
			if count < 1 || count > 1_000_000 {
				return usageError("--count %d outside [1, 1000000]", count)
			}
			if worker < 0 || worker > lay.MaxWorker() {
				return usageError("--worker %d outside [0, %d]", worker, lay.MaxWorker())
			}
			sg, err := snowflake.New(cmd.Context(), snowflake.Config{Layout: lay, Worker: worker})
			if err != nil {
				return err
			}
			defer sg.Close()
			ids := make([]string, 0, count)
			for range count {
				id, err := sg.Next()
				if err != nil {
					return err
				}
				ids = append(ids, id.String())
			}
			if g.json {
				return g.emit(map[string]any{"ids": ids})
			}
			for _, id := range ids {
				g.printf("%s\n", id)
			}
			return nil
		},
	}
	gen.Flags().IntVar(&count, "count", 1, "how many ids")
	gen.Flags().Int64Var(&worker, "worker", 0, "worker id")

	parse := &cobra.Command{
		Use:   "parse ID...",
		Short: "split ids into time, worker and sequence",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lay, err := lf.layout()
			if err != nil {
				return err
			}
			type parsed struct {
				ID       string    `json:"id"`
				Time     time.Time `json:"time"`
				Worker   int64     `json:"worker"`
				Sequence int64     `json:"sequence"`
			}
			var out []parsed
			for _, a := range args {
				id, p, err := lay.ParseString(a)
				if err != nil {
					return &exitErr{code: exitUsage, err: err}
				}
				out = append(out, parsed{id.String(), p.Time, p.Worker, p.Sequence})
			}
			if g.json {
				return g.emit(out)
			}
			for _, p := range out {
				g.printf("%s\ttime %s\tworker %d\tsequence %d\n", p.ID, p.Time.Format(time.RFC3339Nano), p.Worker, p.Sequence)
			}
			return nil
		},
	}
	cmd.AddCommand(gen, parse)
	return cmd
}
