package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// newRecommendCommand: `trainmeter recommend [RUN...] [--min-confidence X] [--json]`.
func newRecommendCommand(cf *clientFlags) *cobra.Command {
	var minConf float64
	var asJSON bool
	c := &cobra.Command{
		Use:   "recommend [RUN_ID...]",
		Short: "List cost recommendations (and each run's dataloader advice) with the total potential savings",
		Long: "Runs the cost optimizer over the given runs (all runs when none is given): batch size, early stopping,\n" +
			"epoch count, dataset size, compute tier, power, and the dataloader settings advised live.\n" +
			"The rules are in docs/recommendations.md.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if minConf < 0 || minConf > 1 {
				return fmt.Errorf("--min-confidence %v: want 0..1", minConf)
			}
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				rc := trainmeterv1.NewRecommendServiceClient(conn)
				resp, err := rc.Recommend(ctx, &trainmeterv1.RecommendRequest{RunIds: args, MinConfidence: minConf})
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(w io.Writer) error {
					writeRecommendations(w, resp, minConf)
					for _, id := range args {
						if err := writeDataloaderSection(ctx, w, conn, id); err != nil {
							return err
						}
					}
					return nil
				})
			})
		},
	}
	c.Flags().Float64Var(&minConf, "min-confidence", 0, "only recommendations with at least this confidence (0..1)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the response as JSON")
	return c
}

func writeRecommendations(w io.Writer, resp *trainmeterv1.RecommendResponse, minConf float64) {
	recs := resp.GetRecommendations()
	if len(recs) == 0 {
		fmt.Fprintf(w, "no recommendations (min confidence %.2f)\n", minConf)
		return
	}
	for i, r := range recs {
		fmt.Fprintf(w, "%d. [%s] %s\n", i+1, r.GetKind(), r.GetTitle())
		fmt.Fprintf(w, "   action:     %s\n", r.GetAction())
		usd, co2 := "-", "" // "-": the saving cannot be costed
		if r.SavingsUsd != nil {
			usd = money.USD(r.GetSavingsUsd())
		}
		if r.SavingsCo2Kg != nil {
			co2 = fmt.Sprintf(", %.4g kg CO2", r.GetSavingsCo2Kg())
		}
		fmt.Fprintf(w, "   savings:    %s, %.0f J%s\n", usd, r.GetSavingsJ(), co2)
		fmt.Fprintf(w, "   confidence: %.2f\n", r.GetConfidence())
		if len(r.GetRisks()) > 0 {
			fmt.Fprintf(w, "   risks:      %s\n", strings.Join(r.GetRisks(), "; "))
		}
		if r.GetEvidence() != "" {
			fmt.Fprintf(w, "   evidence:   %s\n", r.GetEvidence())
		}
		fmt.Fprintf(w, "   runs:       %s\n", strings.Join(r.GetRunIds(), ", "))
	}
	fmt.Fprintf(w, "total potential savings: %s, %.0f J (%s; overlapping ones counted once, never more than a run's cost)\n",
		money.USD(resp.GetTotalSavingsUsd()), resp.GetTotalSavingsJ(), plural.N(len(recs), "recommendation"))
}

// pct shows a ratio as a whole percentage; negative means unknown.
func pct(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*v)
}

// writeDataloaderSection prints a run's live dataloader advice and per-epoch
// statistics; nothing when the run has none.
func writeDataloaderSection(ctx context.Context, w io.Writer, conn *grpc.ClientConn, run string) error {
	h, err := trainmeterv1.NewRecommendServiceClient(conn).DataloaderHistory(ctx, &trainmeterv1.DataloaderHistoryRequest{RunId: run})
	if err != nil {
		return err
	}
	if len(h.GetEvaluations()) == 0 && len(h.GetEpochs()) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\ndataloader advice (%s):\n", run)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	changes := 0
	fmt.Fprintln(tw, "  node\tstep\tclass\tworkers\tprefetch\tdata wait\tGPU\tRAM\texpected gain\tsent\treason")
	for _, e := range h.GetEvaluations() {
		if !e.GetChanged() {
			continue
		}
		if e.GetDelivered() {
			changes++ // an undelivered proposal is listed (sent false) but was not an adjustment
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%v\t%s\n", e.GetNode(), e.GetStep(), e.GetClassification(),
			e.GetNumWorkers(), e.GetPrefetchFactor(), pct(e.GetDataWaitShare()), pct(e.GetGpuUtilization()), pct(e.GetRamUsage()),
			pct(e.GetExpectedGain()), e.GetDelivered(), e.GetReason())
	}
	tw.Flush()
	if n := len(h.GetEvaluations()); n > 0 {
		last := h.GetEvaluations()[n-1]
		fmt.Fprintf(w, "  %s, %s; latest: %s — %s\n", plural.N(n, "evaluation"), plural.N(changes, "adjustment"), last.GetClassification(), last.GetReason())
	}
	if len(h.GetEpochs()) > 0 {
		tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  node\tepoch\tsteps\tadjustments\tworkers\tprefetch\tavg GPU\tavg RAM\tdata wait\tran with\ttok/s (node, after warmup)")
		for _, e := range h.GetEpochs() {
			ep := fmt.Sprint(e.GetEpoch())
			if e.GetPartial() {
				ep += " (partial)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", e.GetNode(), ep, e.GetSteps(), e.GetAdjustments(),
				e.GetNumWorkers(), e.GetPrefetchFactor(), pct(e.GetAvgGpuUtilization()), pct(e.GetAvgRamUsage()), pct(e.GetDataWaitShare()),
				ranWith(e), tokPerS(e.GetTokensPerS()))
		}
		tw.Flush()
	}
	writeDataloaderChanges(w, h.GetChanges())
	return nil
}

// writeDataloaderChanges lists the loader changes the trainer applied, with
// the throughput measured before and after each beside the expected gain.
func writeDataloaderChanges(w io.Writer, cs []*trainmeterv1.DataloaderChange) {
	if len(cs) == 0 {
		return
	}
	fmt.Fprintln(w, "  applied (at the epoch boundary after the advice; tok/s after warmup, all the run's GPUs, measured by the collector):")
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  after epoch\tat\tworkers\tprefetch\ttok/s before\ttok/s after\tmeasured gain\texpected gain")
	for _, c := range cs {
		measured := "-"
		if sp := c.GetMeasuredSpeedup(); sp > 0 {
			measured = fmt.Sprintf("×%.2f (%+.0f%% tok/s)", sp, 100*(sp-1))
		}
		expected := "-"
		if g := c.GetExpectedGain(); g > 0 && g < 1 {
			// Winning back the whole data-wait share g makes steps 1/(1-g) faster.
			expected = fmt.Sprintf("up to ×%.2f (data wait %.0f%%)", 1/(1-g), 100*g)
		}
		if !c.GetReported() {
			// The trainer did not say what its loader ran with: the advisor
			// took the advice as applied.
			expected += " (assumed applied: the trainer reports no loader settings)"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%d→%d\t%d→%d\t%s\t%s\t%s\t%s\n", c.GetAppliedAfterEpoch(), report.Stamp(c.GetAppliedAt()),
			c.GetFromNumWorkers(), c.GetNumWorkers(), c.GetFromPrefetchFactor(), c.GetPrefetchFactor(),
			tokPerS(c.GetTokensPerSBefore()), tokPerS(c.GetTokensPerSAfter()), measured, expected)
	}
	tw.Flush()
}

// ranWith is the loader an epoch ran with, workers/prefetch (workers and
// prefetch before it are those in force at its end: a change delivered
// during the epoch shows there, yet applies only after it).
func ranWith(e *trainmeterv1.DataloaderEpoch) string {
	return fmt.Sprintf("%d/%d", e.GetRanNumWorkers(), e.GetRanPrefetchFactor())
}

// tokPerS shows a throughput; negative means not measured.
func tokPerS(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}
