package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func trend(ts []*trainmeterv1.PriceTrend, window string) string {
	for _, t := range ts {
		if t.GetWindow() == window {
			if t.GetPoints() < 2 {
				return "-"
			}
			return fmt.Sprintf("%+.1f%%", 100*t.GetChange())
		}
	}
	return "-"
}

// rate writes a $/GPU-hour figure, "-" when there is none.
func rate(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

// writeProviderStatus writes how each provider's catalog stands; maxAgeS
// is the collector's max offer age (0: not told), said when a catalog is
// stale.
func writeProviderStatus(w io.Writer, ps []*trainmeterv1.PriceProviderStatus, maxAgeS float64) error {
	if len(ps) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tOFFERS\tSKIPPED\tFETCHED\tAGE\tLATEST FETCH")
	anyStale := false
	for _, p := range ps {
		fetched, age, state := "never", "-", "ok"
		if p.GetFetched() != nil {
			fetched, age = report.Time(p.GetFetched().AsTime()), report.Duration(p.GetAgeS())
		}
		if p.GetImported() {
			state = "imported"
		}
		if p.GetError() != "" {
			state = "failed"
			if p.GetErrorTime() != nil {
				state += " " + report.Time(p.GetErrorTime().AsTime())
			}
			state += ": " + p.GetError()
			if p.GetOffers() > 0 && !p.GetStale() {
				state += " (offers of " + fetched + " kept)"
			}
		}
		if p.GetStale() {
			anyStale = true
			state = "STALE, in no current price; " + state
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", p.GetProvider(), p.GetOffers(), p.GetSkipped(), fetched, age, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if anyStale && maxAgeS > 0 {
		fmt.Fprintf(w, "STALE: offers older than the max offer age, %s (serve --price-max-age), while the provider's fetches fail\n", report.Duration(maxAgeS))
	}
	return nil
}

func newPricesCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	var gpu, provider string
	c := &cobra.Command{
		Use:   "prices",
		Short: "GPU rental prices per model over every provider: cheapest and median on-demand $/GPU-hour, spot, trends; --gpu MODEL adds recommended offers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewPriceServiceClient(conn).ListPrices(ctx, &trainmeterv1.ListPricesRequest{Gpu: gpu, Provider: provider})
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(w io.Writer) error {
					if warn := resp.GetWarning(); warn != "" {
						fmt.Fprintln(w, "warning:", warn)
					}
					if len(resp.GetGpus()) == 0 {
						switch {
						case resp.GetWarning() != "":
						case resp.GetProvider() == "":
							// prices fetch has nothing to fetch from here.
							fmt.Fprintln(w, "no prices: the collector has no price provider; load a price list with `trainmeter prices import FILE`, "+
								"or start it with `trainmeter serve --price-provider vastai,lambda,runpod,azure` (or `--price-provider file --price-file FILE`)")
						default:
							fmt.Fprintln(w, "no prices yet (trainmeter prices fetch)")
						}
						return writeProviderStatus(w, resp.GetProviders(), resp.GetMaxOfferAgeS())
					}
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					// On-demand and spot apart; trends are of the on-demand median.
					fmt.Fprintln(tw, "GPU\tCHEAPEST ON-DEMAND $/GPU-H\tPROVIDER\tMEDIAN ON-DEMAND $/GPU-H\tON-DEMAND OFFERS\tCHEAPEST SPOT $/GPU-H\tSPOT OFFERS\t24H\t7D\t30D\tFETCHED")
					for _, g := range resp.GetGpus() {
						prov := orDash(g.GetCheapest().GetProvider())
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", g.GetGpuName(), rate(g.GetCheapestUsdPerGpuHour()), prov,
							rate(g.GetMedianUsdPerGpuHour()), g.GetOffers(), rate(g.GetCheapestSpotUsdPerGpuHour()), g.GetSpotOffers(),
							trend(g.GetTrends(), "24h"), trend(g.GetTrends(), "7d"), trend(g.GetTrends(), "30d"),
							report.Time(g.GetFetched().AsTime()))
					}
					if err := tw.Flush(); err != nil {
						return err
					}
					for _, g := range resp.GetGpus() {
						if len(g.GetRecommended()) == 0 {
							continue
						}
						fmt.Fprintf(w, "\nrecommended %s offers (score weighs price 0.4, reliability 0.3, perf per dollar 0.3):\n", g.GetGpuName())
						tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
						fmt.Fprintln(tw, "SCORE\tOFFER\tPROVIDER\tPRICING\tGPUS\t$/H\t$/GPU-H\tRELIABILITY\tDLPERF/$\tREGION")
						for _, o := range g.GetRecommended() {
							pricing := "on-demand"
							if o.GetSpot() {
								pricing = "spot"
							}
							fmt.Fprintf(tw, "%.3f\t%s\t%s\t%s\t%d\t%.3f\t%.3f\t%s\t%.1f\t%s\n", o.GetScore(), o.GetId(), o.GetProvider(), pricing, o.GetNumGpus(),
								o.GetUsdPerHour(), o.GetUsdPerGpuHour(), optF(o.Reliability, "%.3f"), o.GetDlperfPerUsd(), o.GetLocation())
						}
						if err := tw.Flush(); err != nil {
							return err
						}
					}
					return writeProviderStatus(w, resp.GetProviders(), resp.GetMaxOfferAgeS())
				})
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringVar(&gpu, "gpu", "", "one GPU model, as the provider or NVML names it (\"RTX 4090\", \"NVIDIA GeForce RTX 4090\"), with recommended offers")
	c.Flags().StringVar(&provider, "provider", "", "only this provider's offers and trends (vastai, lambda, runpod, azure, file, or an imported list's provider)")
	fetch := &cobra.Command{
		Use:   "fetch",
		Short: "Fetch prices from the collector's providers now (a provider that fails keeps its last good offers)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewPriceServiceClient(conn).FetchPrices(ctx, &trainmeterv1.FetchPricesRequest{})
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(w io.Writer) error {
					fmt.Fprintf(w, "fetched: %s of %s in the whole catalog (stale catalogs not counted), %s\n", plural.N(resp.GetOffers(), "current offer"), plural.N(resp.GetGpuModels(), "GPU model"), plural.N(resp.GetAlerts(), "price alert"))
					return writeProviderStatus(w, resp.GetProviders(), 0)
				})
			})
		},
	}
	fetch.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Record the offers of a CSV or JSON price list (docs/budgets.md) as a price fetch",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			offers, err := prices.ParsePriceList(b, "import")
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			req := &trainmeterv1.ImportPricesRequest{}
			for _, o := range offers {
				req.Offers = append(req.Offers, &trainmeterv1.PriceOffer{
					Id: o.ID, Provider: o.Provider, GpuName: o.GPUName, NumGpus: uint32(o.NumGPUs), GpuRamGb: o.GPURAMGB,
					UsdPerHour: o.USDPerHour, Reliability: o.Reliability, DlperfPerUsd: o.DLPerfPerUSD, Location: o.Location, InetDownMbps: o.InetDownMbps,
					Spot: o.Spot,
				})
			}
			return cf.callConn(cmd, func(ctx context.Context, conn *grpc.ClientConn) error {
				resp, err := trainmeterv1.NewPriceServiceClient(conn).ImportPrices(ctx, req)
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(w io.Writer) error {
					fmt.Fprintf(w, "imported %s of %s, %s\n", plural.N(resp.GetOffers(), "offer"), plural.N(resp.GetGpuModels(), "GPU model"), plural.N(resp.GetAlerts(), "price alert"))
					return nil
				})
			})
		},
	}
	imp.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(fetch, imp)
	return c
}
