package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/nvmlgpu"
)

// validateFailed is validate's error when a GPU's verdict is fail.
type validateFailed struct{}

func (validateFailed) Error() string { return "validate: the sensor check failed" }

// newValidateCmd returns `trainmeter-agent validate`. newNVML, when not nil,
// replaces the NVML library (tests).
func newValidateCmd(newNVML func() nvml.Interface) *cobra.Command {
	var (
		asJSON             bool
		duration, interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Watch the GPUs' power sensors for a while (passively) and judge them",
		Long: `validate reads every GPU as the agent does (every 50 ms) for --duration, without
generating any load, and reports per GPU: which NVML fields are supported (186 instant
power, 185 average power, 83 energy counter), how often the sensor updates, the share of
stale reads, how far the energy counter and the integrated instant power disagree under
the current load, and what each NVML call costs; then a verdict (pass, warn, fail). Run
it while a job trains to see the sensor under load. --json gives the whole report for a
bug report. The exit status is 1 when a GPU fails. See docs/doctor.md and docs/accuracy.md.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lib nvml.Interface
			if newNVML != nil {
				lib = newNVML()
			}
			rep, err := nvmlgpu.Validate(lib, nvmlgpu.ValidateOptions{Duration: duration, Interval: interval})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				err = enc.Encode(rep)
			} else {
				err = writeValidate(out, rep)
			}
			if err != nil {
				return err
			}
			if rep.Verdict == nvmlgpu.VerdictFail {
				return validateFailed{}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", 30*time.Second, "how long to watch (30-60 s shows the sensor's behaviour)")
	cmd.Flags().DurationVar(&interval, "interval", 50*time.Millisecond, "time between reads (the agent's sampling interval)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func writeValidate(w io.Writer, rep nvmlgpu.ValidateReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "trainmeter-agent validate: %.0f s, a read every %.0f ms, driver %s\n", rep.DurationS, rep.IntervalMs, rep.Driver)
	yes := map[bool]string{true: "yes", false: "no"}
	for _, g := range rep.GPUs {
		fmt.Fprintf(&b, "\ngpu %d  %s  %s\n", g.Index, g.Name, g.UUID)
		fmt.Fprintf(&b, "  fields supported:   186 instant power %s, 185 average power %s, 83 energy counter %s\n",
			yes[g.InstantPower], yes[g.AveragePower], yes[g.EnergyField])
		fmt.Fprintf(&b, "  sensor update:      power every %.0f ms, energy counter every %.0f ms (median between driver timestamps)\n", g.PowerUpdateMs, g.EnergyUpdateMs)
		fmt.Fprintf(&b, "  stale reads:        power %.0f %%, energy %.0f %% of %d reads\n", g.StalePowerPct, g.StaleEnergyPct, g.Reads)
		fmt.Fprintf(&b, "  energy, this GPU:   counter %.1f J, integrated instant power %.1f J: %+.2f %%\n", g.CounterJ, g.IntegratedJ, g.DisagreementPct)
		b.WriteString("  call cost (µs):     ")
		for i, n := range slices.Sorted(maps.Keys(g.CallCostUs)) {
			c := g.CallCostUs[n]
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %.0f mean / %.0f max", n, c.MeanUs, c.MaxUs)
		}
		b.WriteString("\n")
		for _, r := range g.Reasons {
			fmt.Fprintf(&b, "  %s\n", r)
		}
	}
	fmt.Fprintf(&b, "\nverdict: %s\n", strings.ToUpper(rep.Verdict))
	_, err := io.WriteString(w, b.String())
	return err
}
