package cli

import (
	"cmp"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/trainmeter/trainmeter/collector/internal/numfmt"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func newCompareCommand(cf *clientFlags) *cobra.Command {
	var req trainmeterv1.CompareRequest
	var asJSON, asCSV bool
	c := &cobra.Command{
		Use:   "compare [RUN RUN...]",
		Short: "Compare runs, or a model's runs grouped by a key: mean ± 95 % CI, ratios to a baseline, Welch p-values",
		Long: `Compare runs (each its own group, the first the baseline), or the ended runs of a
model grouped by --by (backend, batch_size, precision, gpu_name, dataset, optimizer,
seq_len, grad_accum, nodes, gpus, label:KEY). Each group's J/token, tok/s, E10k_J,
VRAM peak and $/Mtok are the mean over its runs with a 95 % confidence interval
(Student t); each other group is compared with the baseline as a ratio or a saving,
with a 95 % interval and Welch's t-test p-value (docs/console.md).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON && asCSV {
				return fmt.Errorf("give --json or --csv, not both")
			}
			req.RunIds = args
			return cf.call(cmd, func(ctx context.Context, c trainmeterv1.QueryServiceClient) error {
				resp, err := c.Compare(ctx, &req)
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(w io.Writer) error {
					if asCSV {
						return writeCompareCSV(w, resp)
					}
					return writeCompareTable(w, resp)
				})
			})
		},
	}
	f := c.Flags()
	f.StringVar(&req.Model, "model", "", "compare the ended runs of this model")
	f.StringVar(&req.By, "by", "", "group by this key (backend, batch_size, precision, gpu_name, dataset, optimizer, seq_len, grad_accum, nodes, gpus, label:KEY)")
	f.StringVar(&req.Baseline, "baseline", "", "the baseline group's key (default: the first group)")
	f.BoolVar(&asJSON, "json", false, "print the comparison as JSON")
	f.BoolVar(&asCSV, "csv", false, "print one CSV row per group")
	return c
}

// meanCI shows a mean with its 95 % interval's half-width, or says n=1.
func meanCI(s *trainmeterv1.CompareStat) string {
	switch {
	case s.GetN() == 0:
		return "-"
	case s.CiLow == nil:
		return sig(s.GetMean(), 4) + " (n=1)"
	}
	return sig(s.GetMean(), 4) + " ± " + sig((s.GetCiHigh()-s.GetCiLow())/2, 2)
}

// sig is numfmt.Sig: the console writes figures alike.
func sig(v float64, n int) string { return numfmt.Sig(v, n) }

func diffCell(d *trainmeterv1.CompareDiff, pct bool) string {
	if d == nil {
		return "-"
	}
	f := func(v float64) string {
		if pct {
			return fmt.Sprintf("%+.1f%%", v)
		}
		return fmt.Sprintf("%.3fx", v)
	}
	s := f(d.GetValue())
	if d.CiLow != nil {
		s += fmt.Sprintf(" [%s, %s]", f(d.GetCiLow()), f(d.GetCiHigh()))
	}
	if d.PValue != nil {
		s += fmt.Sprintf(" p=%.3g", d.GetPValue())
	}
	return s
}

func writeCompareTable(w io.Writer, r *trainmeterv1.CompareResponse) error {
	by := cmp.Or(r.GetBy(), "run")
	fmt.Fprintf(w, "per group: mean ± 95 %% CI half-width over its runs (after warmup, all GPUs of a run)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\truns\tJ/token\ttok/s\tE10k_J\tVRAM peak MiB/GPU\t$/Mtok\n", by)
	for _, g := range r.GetGroups() {
		key := g.GetKey()
		if key == r.GetBaseline() {
			key += " (baseline)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", key, len(g.GetRunIds()), meanCI(g.GetJPerToken()), meanCI(g.GetTokPerS()),
			meanCI(g.GetE10KJ()), meanCI(g.GetVramPeakMb()), meanCI(g.GetUsdPerMtok()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nagainst %s: value [95 %% CI] p=Welch's t-test\n", r.GetBaseline())
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tJ/token ratio\tspeedup\tenergy saving\tVRAM saving\tcost saving\n", by)
	for _, row := range r.GetRows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", row.GetKey(), diffCell(row.GetJPerTokenRatio(), false), diffCell(row.GetSpeedup(), false),
			diffCell(row.GetEnergySavingPct(), true), diffCell(row.GetVramSavingPct(), true), diffCell(row.GetCostSavingPct(), true))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, warn := range r.GetWarnings() {
		fmt.Fprintln(w, "warning:", warn)
	}
	return nil
}

// writeCompareCSV writes one row per group: its figures (mean, CI, n) and,
// except for the baseline, its relative figures (value, CI, p-value).
// Missing values are empty cells.
func writeCompareCSV(w io.Writer, r *trainmeterv1.CompareResponse) error {
	cw := csv.NewWriter(w)
	head := []string{"group", "baseline", "runs", "run_ids"}
	stats := []string{"J_per_token", "tok_per_s", "E10k_J", "vram_peak_MB", "usd_per_mtok"}
	for _, s := range stats {
		head = append(head, s+"_mean", s+"_ci_low", s+"_ci_high", s+"_n")
	}
	diffs := []string{"J_per_token_ratio", "speedup", "energy_saving_pct", "vram_saving_pct", "cost_saving_pct"}
	for _, d := range diffs {
		head = append(head, d, d+"_ci_low", d+"_ci_high", d+"_p")
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	num := func(known bool, v float64) string {
		if !known {
			return ""
		}
		return strconv.FormatFloat(v, 'g', 10, 64)
	}
	rows := map[string]*trainmeterv1.CompareRow{}
	for _, row := range r.GetRows() {
		rows[row.GetKey()] = row
	}
	for _, g := range r.GetGroups() {
		rec := []string{g.GetKey(), strconv.FormatBool(g.GetKey() == r.GetBaseline()), strconv.Itoa(len(g.GetRunIds())), strings.Join(g.GetRunIds(), " ")}
		for _, s := range []*trainmeterv1.CompareStat{g.GetJPerToken(), g.GetTokPerS(), g.GetE10KJ(), g.GetVramPeakMb(), g.GetUsdPerMtok()} {
			ci := s.GetN() > 0 && s.CiLow != nil
			rec = append(rec, num(s.GetN() > 0, s.GetMean()), num(ci, s.GetCiLow()), num(ci, s.GetCiHigh()), strconv.Itoa(int(s.GetN())))
		}
		row := rows[g.GetKey()]
		for _, d := range []*trainmeterv1.CompareDiff{row.GetJPerTokenRatio(), row.GetSpeedup(), row.GetEnergySavingPct(), row.GetVramSavingPct(), row.GetCostSavingPct()} {
			ci := d != nil && d.CiLow != nil
			rec = append(rec, num(d != nil, d.GetValue()), num(ci, d.GetCiLow()), num(ci, d.GetCiHigh()), num(d != nil && d.PValue != nil, d.GetPValue()))
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
