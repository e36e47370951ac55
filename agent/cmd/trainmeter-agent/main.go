// Command trainmeter-agent is the per-node daemon: it samples the GPUs,
// receives trainer events on a Unix socket, and streams batches to the
// collector.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trainmeter/trainmeter/agent/internal/agent"
	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/gpuopen"
	"github.com/trainmeter/trainmeter/agent/internal/host"
	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "trainmeter-agent:", err)
		os.Exit(1)
	}
}

// options are what the command line sets.
type options struct {
	cfg             agentconfig.Config
	configFile      string
	check           bool
	shutdownTimeout time.Duration
	allowUIDs       []uint
	otelFlags       *otelexport.Flags
}

func newRootCmd() *cobra.Command { return newRootCmdWith(&options{cfg: agentconfig.DefaultConfig()}) }

func newRootCmdWith(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:           "trainmeter-agent",
		Short:         "Measure GPU energy per training run on this node and stream it to a trainmeter collector",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       agent.Version,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.load(cmd)
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			if o.check {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: OK\n", cmp.Or(o.configFile, "flags"))
				return nil
			}
			return run(cfg, o.shutdownTimeout)
		},
	}
	bindFlags(cmd, o)
	cmd.Flags().BoolVar(&o.check, "check", false, "validate the config file and flags, print OK and exit (1 and every problem when invalid)")
	cmd.AddCommand(newDoctorCmd(nil))
	cmd.AddCommand(newValidateCmd(nil))
	return cmd
}

// bindFlags defines the agent's flags on cmd; the root command and doctor
// share them, so doctor checks exactly what the agent would run with.
func bindFlags(cmd *cobra.Command, o *options) {
	f := cmd.Flags()
	f.StringVar(&o.configFile, "config", "", "YAML config file (flags given on the command line override it)")
	f.StringVar(&o.cfg.Collector, "collector", o.cfg.Collector, "collector address HOST:PORT, or several: A,B (see --collector-mode, docs/deploy.md)")
	f.StringVar(&o.cfg.CollectorMode, "collector-mode", o.cfg.CollectorMode, "with several collectors: all (every batch to each: a pair) or any (each batch to one of them, the next when one fails: replicas on one database)")
	f.StringVar(&o.cfg.Socket, "socket", o.cfg.Socket, "trainer Unix socket path")
	f.StringVar(&o.cfg.SocketGroup, "socket-group", o.cfg.SocketGroup, "group that owns the socket (mode 0660)")
	f.StringVar(&o.cfg.Node, "node", o.cfg.Node, "node name (default: hostname)")
	f.StringVar(&o.cfg.GPU, "gpu", o.cfg.GPU, "GPU backend: nvml, amd, sim:N, replay:FILE, or auto (nvml if a GPU is found, else amd if AMD GPUs and no NVIDIA GPU are found)")
	f.StringVar(&o.cfg.SysfsRoot, "sysfs-root", o.cfg.SysfsRoot, "root of the sysfs tree (tests point it at a fixture)")
	f.StringVar(&o.cfg.ProcfsRoot, "procfs-root", o.cfg.ProcfsRoot, "root of the procfs tree (tests point it at a fixture)")
	f.DurationVar(&o.cfg.Interval, "interval", o.cfg.Interval, "GPU sampling interval")
	f.DurationVar(&o.cfg.Warmup, "warmup", o.cfg.Warmup, "default warmup excluded from efficiency figures (runs naming none; ends at this or --warmup-steps, whichever comes first)")
	f.Uint64Var(&o.cfg.WarmupSteps, "warmup-steps", o.cfg.WarmupSteps, "the default warmup also ends at the run's N-th step, if before --warmup (0: --warmup alone)")
	f.DurationVar(&o.cfg.RejoinGrace, "rejoin-grace", o.cfg.RejoinGrace, "after an agent restart, how long a resumed run waits for a rank to reconnect")
	f.DurationVar(&o.cfg.HostInterval, "host-interval", o.cfg.HostInterval, "host RAM/CPU and RAPL CPU/DRAM energy sampling interval")
	f.StringVar(&o.cfg.HostReplay, "host-replay", o.cfg.HostReplay, "play a host RAM/CPU trace (CSV, docs/replay-format.md) instead of reading the host")
	f.BoolVar(&o.cfg.RawSamples, "raw-samples", o.cfg.RawSamples, "also send every raw GPU sample (not only the 1 s summaries) to the collector")
	f.StringVar(&o.cfg.Spool, "spool", o.cfg.Spool, "directory that keeps batches until the collector acks them")
	f.Int64Var(&o.cfg.SpoolMaxBytes, "spool-max-bytes", o.cfg.SpoolMaxBytes, "bound of the spool in bytes; when full the oldest batches are dropped and reported")
	f.StringVar(&o.cfg.LogLevel, "log-level", o.cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&o.cfg.StatusListen, "status-listen", o.cfg.StatusListen, "serve GET /healthz and GET /status on HOST:PORT (empty: off)")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown may take to flush batches to the collector")
	f.StringVar(&o.cfg.TLSCA, "tls-ca", o.cfg.TLSCA, "verify the collector's certificate with this PEM CA bundle (implies TLS)")
	f.StringVar(&o.cfg.TLSCert, "tls-cert", o.cfg.TLSCert, "client certificate for mTLS (PEM; implies TLS)")
	f.StringVar(&o.cfg.TLSKey, "tls-key", o.cfg.TLSKey, "private key of --tls-cert")
	f.StringVar(&o.cfg.TLSServerName, "tls-server-name", o.cfg.TLSServerName, "name to check in the collector's certificate (implies TLS)")
	f.StringVar(&o.cfg.TokenFile, "token-file", o.cfg.TokenFile, "file with this node's ingest token (needs TLS unless the collector is on loopback)")
	f.IntVar(&o.cfg.SocketMaxConnsPerUID, "socket-max-conns-per-uid", o.cfg.SocketMaxConnsPerUID, "trainer-socket connections one uid may hold open; more from that uid are refused")
	f.DurationVar(&o.cfg.SocketIdleTimeout, "socket-idle-timeout", o.cfg.SocketIdleTimeout, "close a trainer-socket connection that sends no run_start this long after connecting (0: never)")
	f.UintSliceVar(&o.allowUIDs, "allow-uid", nil, "uid allowed to report on the socket (repeatable; root always is; none: socket permissions decide)")
	o.otelFlags = otelexport.BindFlags(f, &o.cfg.OTel)
}

// load turns the parsed flags and the config file into the configuration,
// without validating it (doctor reports validation problems as checks).
// The file is the base: it is read into the struct the flags fill, and the
// flags given on the command line are set again over it.
func (o *options) load(cmd *cobra.Command) (agentconfig.Config, error) {
	if o.configFile != "" {
		type given struct {
			v    pflag.Value
			s    string
			list []string
		}
		var set []given
		cmd.Flags().Visit(func(f *pflag.Flag) {
			g := given{v: f.Value, s: f.Value.String()}
			if l, ok := f.Value.(pflag.SliceValue); ok {
				g.list = slices.Clone(l.GetSlice())
			}
			set = append(set, g)
		})
		o.cfg = agentconfig.DefaultConfig()
		if err := agentconfig.LoadConfigFile(o.configFile, &o.cfg); err != nil {
			return o.cfg, err
		}
		for _, g := range set { // the values parsed once already: no error
			if l, ok := g.v.(pflag.SliceValue); ok {
				_ = l.Replace(g.list)
			} else {
				_ = g.v.Set(g.s)
			}
		}
		// The lists these flags give replace the file's (below: the flags
		// add to the struct's list).
		if cmd.Flags().Changed("otlp-header") {
			o.cfg.OTel.Headers = nil
		}
		if cmd.Flags().Changed("allow-uid") {
			o.cfg.AllowedUIDs = nil
		}
	}
	if err := o.otelFlags.Apply(); err != nil {
		return o.cfg, err
	}
	cfg := o.cfg
	cfg.AllowedUIDs = slices.Clone(o.cfg.AllowedUIDs)
	for _, u := range o.allowUIDs {
		if u > math.MaxUint32 {
			return cfg, fmt.Errorf("--allow-uid %d: not a uid", u)
		}
		cfg.AllowedUIDs = append(cfg.AllowedUIDs, uint32(u))
	}
	if cfg.Node == "" {
		cfg.Node, _ = os.Hostname()
	}
	return cfg, nil
}

func run(cfg agentconfig.Config, shutdownTimeout time.Duration) error {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	backend, err := gpuopen.OpenWith(cfg.GPU, gpuopen.Options{Logger: logger, SysfsRoot: cfg.SysfsRoot, ProcfsRoot: cfg.ProcfsRoot})
	if err != nil {
		return err
	}
	defer backend.Close()

	var hostSampler host.Sampler = host.NewGopsutil()
	if cfg.HostReplay != "" {
		if hostSampler, err = host.OpenReplay(cfg.HostReplay); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a, err := agent.New(cfg, backend, clock.Real{}, hostSampler, logger)
	if fe := (*spool.FormatError)(nil); errors.As(err, &fe) {
		// Restarting cannot cure it, and a failed exit would have systemd
		// restart the agent every 2 s: say so once and wait to be stopped.
		logger.Error("the agent is not running: it waits to be stopped", "err", err)
		<-ctx.Done()
		return nil
	}
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("shutting down: ending runs and flushing batches", "timeout", shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := a.Shutdown(sctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
