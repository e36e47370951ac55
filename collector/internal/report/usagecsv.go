package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// WriteUsageCSV writes a Usage answer's rows as CSV: the grouping keys,
// then the idle row's node, runs, GPU-hours, kWh, cost (empty when
// unknown), the two shares, the price source and whether the row is
// deleted runs'. `trainmeter usage --csv` and the console's Usage page
// download write this.
func WriteUsageCSV(out io.Writer, resp *trainmeterv1.UsageResponse) error {
	w := csv.NewWriter(out)
	head := append(append([]string(nil), resp.GetBy()...), "idle_node", "runs", "gpu_hours", "energy_kWh", "cost_usd", "gpu_share", "energy_share", "price_source", "deleted")
	if err := w.Write(head); err != nil {
		return err
	}
	for _, r := range resp.GetRows() {
		cost := ""
		if r.CostUsd != nil {
			cost = F(r.GetCostUsd())
		}
		row := append(append([]string(nil), r.GetKeys()...), r.GetIdleNode(), fmt.Sprint(r.GetRuns()),
			F(r.GetGpuSeconds()/3600), F(r.GetEnergyJ()/3.6e6), cost,
			F(r.GetGpuShare()), F(r.GetEnergyShare()), r.GetPriceSource(), strconv.FormatBool(r.GetDeleted()))
		if err := w.Write(row); err != nil {
			return err
		}
	}
	w.Flush()
	return w.Error()
}
