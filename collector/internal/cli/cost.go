package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (cf *clientFlags) listRuns(cmd *cobra.Command) ([]*trainmeterv1.RunReport, error) {
	var runs []*trainmeterv1.RunReport
	err := cf.call(cmd, func(ctx context.Context, c trainmeterv1.QueryServiceClient) error {
		var err error
		runs, err = allRuns(ctx, c)
		return err
	})
	return runs, err
}

// Summary is `trainmeter summary --json`.
type Summary struct {
	Runs             int             `json:"runs"`
	Running          int             `json:"running"`
	GPUHours         float64         `json:"gpu_hours"`
	EnergyKWh        float64         `json:"energy_kwh"`
	TotalCostUSD     float64         `json:"total_cost_usd"`
	ProjectedCostUSD float64         `json:"projected_cost_usd"`
	CO2Kg            float64         `json:"co2_kg"`
	Models           []cost.ModelROI `json:"models"`
}

func summarize(runs []*trainmeterv1.RunReport) Summary {
	s := Summary{Runs: len(runs), Models: cost.Models(runs)}
	for _, r := range runs {
		if !r.GetEnded() {
			s.Running++
		}
		s.GPUHours += r.GetGpuHours()
		s.EnergyKWh += r.GetEnergyKwh()
		s.TotalCostUSD += r.GetTotalCostUsd()
		s.ProjectedCostUSD += r.GetProjectedCostUsd()
		s.CO2Kg += r.GetCo2Kg()
	}
	for i := range s.Models {
		s.Models[i].PerRun = nil // per-run detail is `trainmeter model NAME`
	}
	return s
}

func optF(p *float64, format string) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf(format, *p)
}

func orDash(s string) string { return cmp.Or(s, "-") }

// optRate shows an optional unit price in the one money format.
func optRate(p *float64) string {
	if p == nil {
		return "-"
	}
	return money.Rate(*p)
}

func writeModelTable(w io.Writer, models []cost.ModelROI) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tRUNS\tGPU-HOURS\tENERGY kWh\tTOTAL COST\tCOST/MTOK\tBEST ACC\tCOST/POINT (BEST)\tROI pts/$")
	fmt.Fprintln(tw, "\t\twhole runs\twhole runs, all GPUs\twhole runs\twhole runs\t\t\t")
	for _, m := range models {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t%s\n", orDash(m.Model), m.Runs, m.GPUHours, m.EnergyKWh,
			money.USD(m.TotalCostUSD), optRate(m.USDMtok), optF(m.BestPoints, "%.2f"), optRate(m.BestUSDPerPoint), optF(m.ROI, "%.4g"))
	}
	return tw.Flush()
}

func newSummaryCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "summary",
		Short: "All runs: count, GPU-hours, energy, cost, by model",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			runs, err := cf.listRuns(cmd)
			if err != nil {
				return err
			}
			s := summarize(runs)
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, s)
			}
			// Whole runs, warmup included, like `runs` ENERGY kJ: the two
			// agree (docs/measurement.md).
			costs := money.USDs(s.TotalCostUSD, s.ProjectedCostUSD)
			fmt.Fprintf(out, "runs: %d (%d running)\nGPU-hours: %.3f (whole runs, warmup included)\nenergy: %.3f kWh = %.1f kJ (whole runs, all GPUs, warmup included)\ntotal cost: %s (projected at completion: %s)\nCO2: %.3f kg\n\n",
				s.Runs, s.Running, s.GPUHours, s.EnergyKWh, s.EnergyKWh*3600, costs[0], costs[1], s.CO2Kg)
			if len(s.Models) == 0 {
				fmt.Fprintln(out, "no runs yet")
				return nil
			}
			return writeModelTable(out, s.Models)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// ModelRun is one run in `trainmeter model NAME --json`.
type ModelRun struct {
	RunID               string   `json:"run_id"`
	Status              string   `json:"status"`
	Start               string   `json:"start,omitempty"`
	GPUHours            float64  `json:"gpu_hours"`
	TotalCostUSD        float64  `json:"total_cost_usd"`
	ProjectedCostUSD    float64  `json:"projected_cost_usd"`
	AccuracyPoints      *float64 `json:"accuracy_points,omitempty"`
	USDPerAccuracyPoint *float64 `json:"usd_per_accuracy_point,omitempty"`
	EfficiencyScore     *float64 `json:"efficiency_score,omitempty"`
	GainPoints          *float64 `json:"gain_points,omitempty"`
	ROI                 *float64 `json:"roi_points_per_usd,omitempty"`
}

// ModelView is `trainmeter model NAME --json`.
type ModelView struct {
	Model      cost.ModelROI   `json:"model"`
	Runs       []ModelRun      `json:"runs"`
	Comparison []cost.ModelROI `json:"comparison"`
}

func modelView(name string, all []*trainmeterv1.RunReport) (ModelView, bool) {
	var mine []*trainmeterv1.RunReport
	for _, r := range all {
		if r.GetMetadata().GetModel() == name {
			mine = append(mine, r)
		}
	}
	if len(mine) == 0 {
		return ModelView{}, false
	}
	v := ModelView{Comparison: cost.Models(all)}
	for i := range v.Comparison {
		v.Comparison[i].PerRun = nil
	}
	v.Model = cost.Models(mine)[0]
	byID := map[string]*trainmeterv1.RunReport{}
	for _, r := range mine {
		byID[r.GetRunId()] = r
	}
	for _, roi := range v.Model.PerRun {
		r := byID[roi.RunID]
		mr := ModelRun{
			RunID: r.GetRunId(), Status: report.EndStatus(r), GPUHours: r.GetGpuHours(),
			TotalCostUSD: r.GetTotalCostUsd(), ProjectedCostUSD: r.GetProjectedCostUsd(),
			AccuracyPoints: r.AccuracyPoints, USDPerAccuracyPoint: r.UsdPerAccuracyPoint,
			EfficiencyScore: r.EfficiencyScore, GainPoints: roi.GainPoints, ROI: roi.ROI,
		}
		if r.GetStart() != nil {
			mr.Start = report.Time(r.GetStart().AsTime())
		}
		v.Runs = append(v.Runs, mr)
	}
	return v, true
}

func newModelCommand(cf *clientFlags) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "model NAME",
		Short: "A model's runs, their cost and ROI, compared with the other models",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runs, err := cf.listRuns(cmd)
			if err != nil {
				return err
			}
			v, ok := modelView(args[0], runs)
			if !ok {
				models := map[string]bool{}
				for _, r := range runs {
					models[fmt.Sprintf("%q", r.GetMetadata().GetModel())] = true
				}
				return fmt.Errorf("no runs of model %q (models with runs: %v)", args[0], slices.Sorted(maps.Keys(models)))
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, v)
			}
			m := v.Model
			fmt.Fprintf(out, "model %s: %s, %.3f GPU-hours, %.3f kWh (whole runs, all GPUs), total %s\n", m.Model, plural.N(m.Runs, "run"), m.GPUHours, m.EnergyKWh, money.USD(m.TotalCostUSD))
			fmt.Fprintf(out, "baseline %s (%s points), best %s (%s points, %s per point), ROI %s points per $ after the baseline\n\n",
				orDash(m.Baseline), optF(m.BaselinePoints, "%.2f"), orDash(m.Best), optF(m.BestPoints, "%.2f"),
				optRate(m.BestUSDPerPoint), optF(m.ROI, "%.4g"))
			if m.FailedRuns > 0 {
				fmt.Fprintf(out, "%s (error, exit N, signal or lost): in the cost, never the baseline or the best, no gain\n\n", plural.N(m.FailedRuns, "failed run"))
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tSTATUS\tSTART\tGPU-HOURS\tTOTAL COST\tPROJECTED COST\tACC\tCOST/POINT\tEFFICIENCY\tGAIN\tROI pts/$")
			fmt.Fprintln(tw, "\t\t\twhole run\twhole run\tat completion\t\t\t\t\t")
			for _, r := range v.Runs {
				costs := money.USDs(r.TotalCostUSD, r.ProjectedCostUSD)
				fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.Status, orDash(r.Start), r.GPUHours,
					costs[0], costs[1], optF(r.AccuracyPoints, "%.2f"), optRate(r.USDPerAccuracyPoint),
					optF(r.EfficiencyScore, "%.3f"), optF(r.GainPoints, "%+.2f"), optF(r.ROI, "%.4g"))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintln(out, "\ncompared with all models")
			return writeModelTable(out, v.Comparison)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
