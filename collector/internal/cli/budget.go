package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func newBudgetCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "budget",
		Short: "Show every budget's use in its current period (set one with `budget set`)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewBudgetServiceClient(conn).ListBudgets(ctx, &trainmeterv1.ListBudgetsRequest{})
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(w io.Writer) error {
					if len(resp.GetBudgets()) == 0 {
						fmt.Fprintln(w, "no budgets (trainmeter budget set SCOPE USD)")
						return nil
					}
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "SCOPE\tPERIOD\tBUDGET\tSPENT\tUSED\tPROJECTED\tPROJ USED\tRUNS\tLIVE\tPOLICY")
					for _, b := range resp.GetBudgets() {
						pol := cmp.Or(b.GetBudget().GetPolicy(), "alert")
						// The same rounding as the alerts (internal/money): spent and
						// budget in the decimals of the larger.
						amounts := money.USDs(b.GetBudget().GetLimitUsd(), b.GetSpentUsd(), b.GetProjectedUsd())
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", b.GetBudget().GetScope(), b.GetPeriodKey(),
							amounts[0], amounts[1], pct(b.GetRatio()), amounts[2],
							pct(b.GetProjectedRatio()), b.GetRuns(), b.GetLiveRuns(), pol)
					}
					return tw.Flush()
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var period, policy string
	set := &cobra.Command{
		Use:   "set SCOPE USD",
		Short: "Set the budget of a scope: a budget_scope, model:NAME, team:X, label:KEY=VALUE or *",
		Long: "Set (or replace) the budget of SCOPE in USD. Alerts fire at 50, 75, 90 and 100 % of it, on actual\n" +
			"and on projected spend. --policy stop also stops the runs of the scope once it is exceeded.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			amount, err := strconv.ParseFloat(strings.TrimPrefix(args[1], "$"), 64)
			if err != nil {
				return fmt.Errorf("budget amount %q is not a number of USD: give the most SCOPE may spend, e.g. trainmeter budget set %s 5000", args[1], args[0])
			}
			if !(amount > 0) || math.IsInf(amount, 0) {
				return negativeBudget(args[1])
			}
			// One id on every collector of a pair: their alerts for it
			// then carry the same ids.
			id := ""
			if len(cf.collectorAddrs()) > 1 {
				id = budget.NewBudgetID()
			}
			return cf.callEach(cmd, "budget set", func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewBudgetServiceClient(conn).SetBudget(ctx, &trainmeterv1.SetBudgetRequest{Scope: args[0], LimitUsd: amount, Period: period, Policy: policy, BudgetId: id})
				if err != nil {
					return err
				}
				b := resp.GetBudget()
				pol := cmp.Or(b.GetPolicy(), "alert")
				per := "in total"
				if b.GetPeriod() == "month" {
					per = "per calendar month"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "budget %s: %s %s, policy %s\n", b.GetScope(), money.USD(b.GetLimitUsd()), per, pol)
				return nil
			})
		},
	}
	// "-5" reaches pflag as a shorthand flag before RunE sees it.
	set.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if _, tok, ok := strings.Cut(err.Error(), "unknown shorthand flag: "); ok {
			if _, arg, ok := strings.Cut(tok, " in "); ok {
				if _, perr := strconv.ParseFloat(arg, 64); perr == nil {
					return negativeBudget(arg)
				}
			}
		}
		return err
	})
	set.Flags().StringVar(&period, "period", "total", "total or month")
	set.Flags().StringVar(&policy, "policy", "alert", "alert, or stop (send a stop to the scope's runs once exceeded)")

	var delPeriod string
	del := &cobra.Command{
		Use:   "delete SCOPE",
		Short: "Delete the budget of a scope",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.callEach(cmd, "budget delete", func(ctx context.Context, conn *grpc.ClientConn) error {
				_, err := trainmeterv1.NewBudgetServiceClient(conn).DeleteBudget(ctx, &trainmeterv1.DeleteBudgetRequest{Scope: args[0], Period: delPeriod})
				if err == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "budget %s deleted\n", args[0])
				}
				return err
			})
		},
	}
	del.Flags().StringVar(&delPeriod, "period", "total", "total or month")
	c.AddCommand(set, del)
	return c
}

// negativeBudget is the error for an amount that is not above 0.
func negativeBudget(amount string) error {
	return fmt.Errorf("budget amount %s: a budget is the most a scope may spend, a number of USD above 0 (e.g. 5000); to remove a budget: trainmeter budget delete SCOPE", amount)
}

func newAlertsCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	var kind string
	c := &cobra.Command{
		Use:   "alerts",
		Short: "List budget and price alerts, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				alerts, err := allAlerts(ctx, trainmeterv1.NewBudgetServiceClient(conn), kind)
				return show(cmd.OutOrStdout(), asJSON, &trainmeterv1.ListAlertsResponse{Alerts: alerts}, err, func(w io.Writer) error {
					if len(alerts) == 0 {
						fmt.Fprintln(w, "no alerts")
						return nil
					}
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "TIME\tKIND\tSEVERITY\tMESSAGE")
					for _, a := range alerts {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", report.Time(a.GetTime().AsTime()), a.GetKind(), a.GetSeverity(), a.GetMessage())
					}
					return tw.Flush()
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringVar(&kind, "kind", "", "only budget, price or max-cost alerts")
	return c
}

func newForecastCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	var history uint32
	c := &cobra.Command{
		Use:   "forecast MODEL N",
		Short: "Cost of N more runs of MODEL like its last ones, against its budget, with the overage risk",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseUint(args[1], 10, 32)
			if err != nil || n == 0 {
				return fmt.Errorf("number of runs %q: want a whole number > 0", args[1])
			}
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				f, err := trainmeterv1.NewBudgetServiceClient(conn).Forecast(ctx, &trainmeterv1.ForecastRequest{Model: args[0], Runs: uint32(n), History: history})
				return show(cmd.OutOrStdout(), asJSON, f, err, func(w io.Writer) error {
					fmt.Fprintf(w, "model %s: %s more, based on the last %s (%s)\n", f.GetModel(), plural.N(f.GetRuns(), "run"), plural.N(len(f.GetBasedOn()), "ended run"), strings.Join(f.GetBasedOn(), ", "))
					if n := f.GetFailedLeftOut(); n > 0 {
						fmt.Fprintf(w, "  %s of the model left out (error, exit N, signal or lost)\n", plural.N(n, "failed run"))
					}
					// One set of decimals for the whole forecast (internal/money),
					// enough for its smallest figure: the cost of one run.
					d := max(money.Decimals(f.GetMeanRunUsd()), money.Decimals(f.GetExpectedUsd()), money.Decimals(f.GetBudgetUsd()))
					usd := func(v float64) string { return money.Fixed(v, d) }
					fmt.Fprintf(w, "  per run     %s ± %s\n", usd(f.GetMeanRunUsd()), usd(f.GetStddevRunUsd()))
					fmt.Fprintf(w, "  expected    %s ± %s\n", usd(f.GetExpectedUsd()), usd(f.GetStddevUsd()))
					if f.BudgetUsd == nil {
						fmt.Fprintln(w, "  budget      none covers this model")
						return nil
					}
					left := usd(f.GetRemainingUsd()) + " left"
					if f.GetRemainingUsd() < 0 {
						left = "already over by " + usd(-f.GetRemainingUsd())
					}
					fmt.Fprintf(w, "  budget      %s (%s): %s, %s\n", f.GetBudgetScope(), f.GetBudgetPeriod(), usd(f.GetBudgetUsd()), left)
					fmt.Fprintf(w, "  overage     %.0f%% risk of exceeding it\n", 100*f.GetOverageProbability())
					return nil
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().Uint32Var(&history, "history", 5, "how many of the model's latest ended runs to learn from")
	return c
}
