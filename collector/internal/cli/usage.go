package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// timestampOrNil is t, or nil (unbounded) for the zero time.
func timestampOrNil(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func newUsageCommand(cf *clientFlags) *cobra.Command {
	var since, until string
	var by []string
	var asJSON, asCSV bool
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "GPU-hours, energy and cost per node, GPU, model, user or label, with each node's idle time",
		Long: `usage is showback: over [--since, --until) it sums the nodes' GPU time, energy
and cost by the groups named with --by (node, gpu, model, user, label:KEY, and account, partition and
namespace for the labels slurm.account, slurm.partition and k8s.namespace that
Slurm jobs' and pods' runs carry; repeatable, default node). Each node has an "(idle)" row for GPU time no run
used; runs without the label (or model, or user) are "(unlabeled)"; runs
deleted since (delete-run) are "(deleted)" rows, for their nodes used that
GPU time and energy. The rows add up to the nodes' totals, shown below them,
in GPU-hours, energy and cost. Shared GPUs are split between
their runs (docs/measurement.md); the cost is GPU time at the node's GPU price
plus energy at the energy price (docs/costs.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON && asCSV {
				return fmt.Errorf("--json and --csv: choose one")
			}
			now := time.Now()
			s, err := parseWhen("since", since, now)
			if err != nil {
				return err
			}
			u, err := parseWhen("until", until, now)
			if err != nil {
				return err
			}
			return cf.call(cmd, func(ctx context.Context, c trainmeterv1.QueryServiceClient) error {
				resp, err := c.Usage(ctx, &trainmeterv1.UsageRequest{Since: timestampOrNil(s), Until: timestampOrNil(u), By: by})
				return show(cmd.OutOrStdout(), asJSON, resp, err, func(io.Writer) error {
					if asCSV {
						return report.WriteUsageCSV(cmd.OutOrStdout(), resp)
					}
					return writeUsageTable(cmd, resp)
				})
			})
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "start of the period (RFC 3339, a UTC date, or a duration before now)")
	cmd.Flags().StringVar(&until, "until", "", "end of the period, exclusive (same forms)")
	cmd.Flags().StringArrayVar(&by, "by", nil, "group by node, gpu, model, user, account, partition, namespace or label:KEY (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the rows and node totals as JSON")
	cmd.Flags().BoolVar(&asCSV, "csv", false, "print the rows as CSV")
	return cmd
}

// usageKeys are a row's group keys as the table shows them: an idle row
// names its node, and is marked idle where it is grouped by node or GPU
// (its keys are then the node's or the GPU's own); a deleted runs' row is
// marked deleted there (elsewhere its keys say "(deleted)").
func usageKeys(resp *trainmeterv1.UsageResponse, r *trainmeterv1.UsageRow) []string {
	keys := append([]string(nil), r.GetKeys()...)
	byHardware := slices.Contains(resp.GetBy(), "node") || slices.Contains(resp.GetBy(), "gpu")
	mark := ""
	switch {
	case r.GetDeleted() && byHardware:
		mark = " (deleted)"
	case r.GetIdle() && byHardware:
		mark = " (idle)"
	case r.GetIdle():
		mark = " " + r.GetIdleNode()
	}
	for i := range keys {
		keys[i] += mark
	}
	return keys
}

func writeUsageTable(cmd *cobra.Command, resp *trainmeterv1.UsageResponse) error {
	out := cmd.OutOrStdout()
	if len(resp.GetNodes()) == 0 {
		fmt.Fprintln(out, "no GPU data in this period")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	head := make([]string, 0, len(resp.GetBy())+6)
	for _, b := range resp.GetBy() {
		head = append(head, strings.ToUpper(b))
	}
	head = append(head, "RUNS", "GPU-HOURS", "ENERGY kWh", "COST $", "SHARE OF GPU-HOURS", "SHARE OF ENERGY")
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range resp.GetRows() {
		cost := "-"
		if r.CostUsd != nil {
			cost = money.USD(r.GetCostUsd())
		}
		fmt.Fprintf(tw, "%s\t%d\t%.4f\t%.6f\t%s\t%.1f%%\t%.1f%%\n", strings.Join(usageKeys(resp, r), "\t"), r.GetRuns(),
			r.GetGpuSeconds()/3600, r.GetEnergyJ()/3.6e6, cost, 100*r.GetGpuShare(), 100*r.GetEnergyShare())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if slices.ContainsFunc(resp.GetRows(), (*trainmeterv1.UsageRow).GetDeleted) {
		fmt.Fprintln(out, "(deleted): runs deleted since (delete-run); their nodes used that GPU time and energy, so it stays here")
	}
	// Host (CPU package + DRAM, RAPL) columns only where a node measured
	// it, so GPU-only fleets read as before.
	host := slices.ContainsFunc(resp.GetNodes(), func(n *trainmeterv1.NodeUsage) bool { return n.GetHostEnergyJ() > 0 })
	if host {
		fmt.Fprintln(out, "\nnode totals (all GPUs of the node, over the period; idle = no run on the GPU; host = CPU packages + DRAM (RAPL), idle host = no run on the node)")
	} else {
		fmt.Fprintln(out, "\nnode totals (all GPUs of the node, over the period; idle = no run on the GPU)")
	}
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\t"+nodeFiguresHead(host))
	for _, n := range resp.GetNodes() {
		fmt.Fprintf(tw, "%s\t", n.GetNode())
		writeNodeFigures(tw, host, n.GetGpuSeconds(), n.GetEnergyJ(), n.GetIdleGpuSeconds(), n.GetIdleEnergyJ(),
			n.GetHostEnergyJ(), n.GetIdleHostEnergyJ())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeUsageLost(cmd, resp, host)
}

// writeUsageLost lists what the nodes' agents had to drop (full spool or
// disk, rejected batches), which the figures above do not hold; only when
// some node lost something.
func writeUsageLost(cmd *cobra.Command, resp *trainmeterv1.UsageResponse, host bool) error {
	var lost []*trainmeterv1.NodeUsage
	for _, n := range resp.GetNodes() {
		if n.GetLostBatches() > 0 {
			lost = append(lost, n)
		}
		host = host || n.GetLostHostEnergyJ() > 0
	}
	if len(lost) == 0 {
		return nil
	}
	out := cmd.OutOrStdout()
	fmt.Fprintln(out, "\nINCOMPLETE: dropped on the agents, not in the figures above (node total = above + dropped; the runs' parts are in their reports' lost_* figures)")
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tBATCHES\t"+nodeFiguresHead(host))
	for _, n := range lost {
		fmt.Fprintf(tw, "%s\t%d\t", n.GetNode(), n.GetLostBatches())
		writeNodeFigures(tw, host, n.GetLostGpuSeconds(), n.GetLostEnergyJ(), n.GetLostIdleGpuSeconds(), n.GetLostIdleEnergyJ(),
			n.GetLostHostEnergyJ(), n.GetLostIdleHostEnergyJ())
	}
	return tw.Flush()
}

// nodeFiguresHead names writeNodeFigures' columns.
func nodeFiguresHead(host bool) string {
	if host {
		return "GPU-HOURS\tENERGY kWh\tIDLE GPU-HOURS\tIDLE ENERGY kWh\tHOST (CPU+DRAM) kWh\tIDLE HOST kWh"
	}
	return "GPU-HOURS\tENERGY kWh\tIDLE GPU-HOURS\tIDLE ENERGY kWh"
}

// writeNodeFigures ends a node's row of a usage node table: its GPU time
// and energy, their idle parts and, with host, its CPU+DRAM energy.
func writeNodeFigures(w io.Writer, host bool, gpuS, energyJ, idleGPUS, idleJ, hostJ, idleHostJ float64) {
	fmt.Fprintf(w, "%.4f\t%.6f\t%.4f\t%.6f", gpuS/3600, energyJ/3.6e6, idleGPUS/3600, idleJ/3.6e6)
	if host {
		fmt.Fprintf(w, "\t%.6f\t%.6f", hostJ/3.6e6, idleHostJ/3.6e6)
	}
	fmt.Fprintln(w)
}
