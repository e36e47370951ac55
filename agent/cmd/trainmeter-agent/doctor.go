package main

import (
	"os/signal"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/doctor"
	"github.com/trainmeter/trainmeter/internal/plural"
)

// doctorFailed is doctor's error when a check failed: the report says what,
// so main only adds one line and exits 1.
type doctorFailed struct{ n int }

func (e doctorFailed) Error() string { return "doctor: " + plural.N(e.n, "check") + " failed" }

// newDoctorCmd returns `trainmeter-agent doctor`. newNVML, when not nil,
// replaces the NVML library (tests).
func newDoctorCmd(newNVML func() nvml.Interface) *cobra.Command {
	o := &options{cfg: agentconfig.DefaultConfig()}
	var (
		asJSON  bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this node's GPUs, trainer socket, collector and spool, and say what is wrong",
		Long: `doctor checks, with the agent's own flags and config file, what makes the numbers
missing or zero: the GPU backend (NVML and the driver, each GPU's power and energy
fields with a live reading, MIG mode), the trainer socket (is an agent listening, who
may connect), the collector (reachable, healthy, TLS, the ingest token) and the spool.
Each check is one line: OK, WARN or FAIL, with a hint. The exit status is 1 when a
check failed. It changes nothing on a running agent or collector.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.load(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			rep := doctor.Run(ctx, doctor.Options{Config: cfg, ConfigFile: o.configFile, NVML: newNVML, Timeout: timeout})
			out := cmd.OutOrStdout()
			if asJSON {
				err = rep.WriteJSON(out)
			} else {
				err = rep.WriteText(out)
			}
			if err != nil {
				return err
			}
			if n := rep.Count(doctor.Fail); n > 0 {
				return doctorFailed{n}
			}
			return nil
		},
	}
	bindFlags(cmd, o)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "time limit of each network check")
	return cmd
}
