package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes one row per cell: messages, faults injected (and how
// many hit in-flight work), duplicate deliveries seen, duplicate effects,
// lost, msgs/s; then each cell's faults and problems.
func WriteTable(w io.Writer, rs []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tstore\tbroker\tbatch\tmessages\tfaults (hit)\tdup deliveries\tdup effects\tlost\treruns after fault\tfenced\tdead letters\tunrecorded (reruns)\treruns after lost claim\tmsgs/s\tresult\t")
	var tot Result
	for _, r := range rs {
		v := "pass"
		if !r.Pass {
			v = "FAIL"
		}
		batch := "-"
		if r.Batch > 0 {
			batch = fmt.Sprint(r.Batch)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d (%d)\t%d\t%d\t%d\t%d\t%d\t%d\t%d (%d)\t%d\t%.0f\t%s\t\n", r.Scenario, r.Store, r.Broker, batch, r.Messages,
			r.Injected, r.Hit, r.DupDeliveries, r.DupEffects, r.Lost, r.Reruns, r.Fenced, r.DeadLettered, r.Unrecorded, r.RerunsUnrecorded, r.RerunsLost, r.MsgsPerSec, v)
		tot.Messages += r.Messages
		tot.Injected += r.Injected
		tot.Hit += r.Hit
		tot.DupDeliveries += r.DupDeliveries
		tot.DupEffects += r.DupEffects
		tot.Lost += r.Lost
		tot.Reruns += r.Reruns
		tot.Fenced += r.Fenced
		tot.DeadLettered += r.DeadLettered
		tot.Unrecorded += r.Unrecorded
		tot.RerunsUnrecorded += r.RerunsUnrecorded
		tot.RerunsLost += r.RerunsLost
		tot.Elapsed += r.Elapsed
	}
	if len(rs) > 1 {
		rate := 0.0
		if tot.Elapsed > 0 {
			rate = float64(tot.Messages) / tot.Elapsed
		}
		fmt.Fprintf(tw, "total\t\t\t\t%d\t%d (%d)\t%d\t%d\t%d\t%d\t%d\t%d\t%d (%d)\t%d\t%.0f\t\t\n", tot.Messages, tot.Injected, tot.Hit,
			tot.DupDeliveries, tot.DupEffects, tot.Lost, tot.Reruns, tot.Fenced, tot.DeadLettered, tot.Unrecorded, tot.RerunsUnrecorded, tot.RerunsLost, rate)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rs {
		if len(r.Faults) == 0 && len(r.Problems) == 0 && r.DeadLetterRepublished == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (seed %d):\n", strings.ReplaceAll(r.Cell.String(), "/", " / "), r.Seed)
		for _, f := range r.Faults {
			hit := "hit"
			if !f.Hit {
				hit = "HIT NOTHING"
			}
			fmt.Fprintf(w, "  %8s  %-22s %-11s %-11s %s\n", f.At, f.Kind, f.Target, hit, f.Evidence)
		}
		if r.DeadLetterRepublished > 0 {
			fmt.Fprintf(w, "  note: %d dead letters published again with the same dead-letter id (the broker has no publish dedup)\n", r.DeadLetterRepublished)
		}
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  problem: %s\n", strings.TrimSpace(p))
		}
	}
	return nil
}

// WriteJSON writes the results as a JSON array with the table's fields.
func WriteJSON(w io.Writer, rs []Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if rs == nil {
		rs = []Result{}
	}
	return enc.Encode(rs)
}
