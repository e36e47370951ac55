package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func newRepriceCommand(cf *clientFlags) *cobra.Command {
	var run, since, reason string
	var price float64
	c := &cobra.Command{
		Use:   "reprice (--run RUN_ID | --since TIME) --price USD_PER_GPU_HOUR --reason TEXT",
		Short: "Change the booked GPU price of a run, or of every run since a time (needs the admin token when the collector has tokens)",
		Long: `A run's cost is booked at the prices in force when its GPU time was used, and
a later price list or a collector restarted with other prices leaves it as it
was (docs/costs.md, "Locked prices"). reprice is the one way to change it: it
books the GPU time of one run (--run), or of every run's windows that start at
or after --since (RFC 3339, a UTC date, or a duration before now), at --price
USD per GPU-hour. Each run repriced shows when, its cost before and the
--reason in report, --json, the CSV and the console; the collector logs it.
Energy cost and idle rows are not changed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (run == "") == (since == "") {
				return errors.New("give --run RUN_ID or --since TIME (one of them)")
			}
			if price <= 0 {
				return errors.New("--price USD_PER_GPU_HOUR must be > 0")
			}
			if reason == "" {
				return errors.New("--reason is required: it is kept on each run repriced")
			}
			s, err := parseWhen("since", since, time.Now())
			if err != nil {
				return err
			}
			req := &trainmeterv1.RepriceRequest{RunId: run, Since: timestampOrNil(s), UsdPerGpuHour: price, Reason: reason}
			return cf.callEach(cmd, "reprice", func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewQueryServiceClient(conn).Reprice(ctx, req)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "repriced %s at %s/GPU-hour\n", plural.N(uint64(len(resp.GetRuns())), "run"), money.Rate(price))
				for _, r := range resp.GetRuns() {
					fmt.Fprintf(out, "  %s: %.4g GPU-hours, GPU cost %s -> %s\n", r.GetRunId(), r.GetGpuSeconds()/3600,
						money.USD(r.GetPreviousCostUsd()), money.USD(r.GetCostUsd()))
				}
				return nil
			})
		},
	}
	c.Flags().StringVar(&run, "run", "", "the run to reprice (all of its GPU time)")
	c.Flags().StringVar(&since, "since", "", "reprice every run's GPU time in windows starting at or after this time")
	c.Flags().Float64Var(&price, "price", 0, "the new GPU price, USD per GPU-hour")
	c.Flags().StringVar(&reason, "reason", "", "why (kept on each run repriced)")
	return c
}
