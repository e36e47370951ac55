package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func newEstimateCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	req := &trainmeterv1.EstimateRequest{}
	c := &cobra.Command{
		Use:   "estimate --model M --tokens N [--gpu NAME] [--gpus K]",
		Short: "Time, energy and cost of a run of a model over N tokens, with a band, from the model's past runs",
		Long: `Estimate a run of MODEL over N tokens from MODEL's ended runs (whole-run
figures, warmup included): the median run's pace, and the best and worst
run's as the band. --gpu prices another GPU (the price catalog, owned
hardware, or --gpu-price-per-hour); its speed is known only from past runs
on it, else the past runs' speed stands and only the price changes.
--gpus scales the wall time linearly. docs/costs.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(req.GetModel()) == "" || req.GetTokens() == 0 {
				return fmt.Errorf("give --model and --tokens (a number > 0), e.g. trainmeter estimate --model llama-3-8b --tokens 2e9")
			}
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewBudgetServiceClient(conn).Estimate(ctx, req)
				return show(cmd.OutOrStdout(), asJSON, resp.GetEstimate(), err, func(w io.Writer) error {
					writeEstimate(w, resp.GetEstimate())
					return nil
				})
			})
		},
	}
	f := c.Flags()
	f.StringVar(&req.Model, "model", "", "model whose past runs to learn from")
	f.Var(&tokenCount{&req.Tokens}, "tokens", "tokens the run will process (2000000000, 2e9)")
	f.StringVar(&req.Gpu, "gpu", "", "GPU model to price (default: the past runs' own, priced as they were)")
	f.Uint32Var(&req.Gpus, "gpus", 0, "GPUs of the run (default: the past runs' median)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// writeEstimate prints an estimate: mid, then the band in parentheses.
func writeEstimate(w io.Writer, e *trainmeterv1.RunEstimate) {
	gpu := cmp.Or(e.GetGpu(), e.GetMeasuredOn())
	fmt.Fprintf(w, "estimate for %s: %d tokens on %d x %s, from %s (%s)\n", e.GetModel(), e.GetTokens(), e.GetGpus(), gpu,
		plural.N(len(e.GetBasedOn()), "past run"), strings.Join(e.GetBasedOn(), ", "))
	fmt.Fprintf(w, "  (whole run, warmup included; mid = the median past run's pace, band = the best and worst run's)\n")
	wall, gh, kwh, c := e.GetWallS(), e.GetGpuHours(), e.GetEnergyKwh(), e.GetCostUsd()
	fmt.Fprintf(w, "  wall time   %s (%s to %s)\n", report.DurS(wall.GetMid()), report.DurS(wall.GetLow()), report.DurS(wall.GetHigh()))
	fmt.Fprintf(w, "  GPU-hours   %.4g (%.4g to %.4g), all GPUs\n", gh.GetMid(), gh.GetLow(), gh.GetHigh())
	fmt.Fprintf(w, "  energy      %.4g kWh (%.4g to %.4g), GPU energy, all GPUs\n", kwh.GetMid(), kwh.GetLow(), kwh.GetHigh())
	if c != nil {
		band := money.USDs(c.GetMid(), c.GetLow(), c.GetHigh())
		fmt.Fprintf(w, "  cost        %s (%s to %s)\n", band[0], band[1], band[2])
	} else {
		fmt.Fprintf(w, "  cost        - (no price)\n")
	}
	if e.GetPriceSource() != "" {
		fmt.Fprintf(w, "  GPU price   %s/GPU-hour, %s\n", money.Rate(e.GetGpuPricePerHour()), report.PriceSourceWords(e.GetPriceSource()))
	}
	if e.GetPue() > 1 {
		fmt.Fprintf(w, "  PUE         %.3g (energy cost is of GPU energy x PUE)\n", e.GetPue())
	}
	for _, n := range e.GetNotes() {
		fmt.Fprintf(w, "  note        %s\n", n)
	}
}

// tokenCount is a --tokens value: a whole number of tokens, written out or
// in e-notation (2e9).
type tokenCount struct{ v *uint64 }

func (t *tokenCount) String() string {
	if t.v == nil {
		return "0"
	}
	return strconv.FormatUint(*t.v, 10)
}

func (t *tokenCount) Set(s string) error {
	if n, err := strconv.ParseUint(s, 10, 64); err == nil && n > 0 {
		*t.v = n
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 1) || f > 1e18 || f != math.Trunc(f) {
		return fmt.Errorf("%q: want a whole number of tokens > 0 (e.g. 2000000000 or 2e9)", s)
	}
	*t.v = uint64(f)
	return nil
}

func (t *tokenCount) Type() string { return "N" }
