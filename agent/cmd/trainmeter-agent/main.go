// Command trainmeter-agent is the per-node daemon: it samples the GPUs,
// receives trainer events on a Unix socket, and streams batches to the
// collector.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/trainmeter/trainmeter/agent/internal/agent"
	"github.com/trainmeter/trainmeter/agent/internal/gpuopen"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/host"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "trainmeter-agent:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	cfg := agent.DefaultConfig()
	var configFile string
	var shutdownTimeout time.Duration
	cmd := &cobra.Command{
		Use:           "trainmeter-agent",
		Short:         "Measure GPU energy per training run on this node and stream it to a trainmeter collector",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       agent.Version,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				// The file is the base; flags given on the command line win.
				fromFile := agent.DefaultConfig()
				if err := agent.LoadConfigFile(configFile, &fromFile); err != nil {
					return err
				}
				overlayFlags(cmd, &fromFile, cfg)
				cfg = fromFile
			}
			if cfg.Node == "" {
				cfg.Node, _ = os.Hostname()
			}
			return run(cmd.Context(), cfg, shutdownTimeout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML config file (flags given on the command line override it)")
	f.StringVar(&cfg.Collector, "collector", cfg.Collector, "collector address HOST:PORT")
	f.StringVar(&cfg.Socket, "socket", cfg.Socket, "trainer Unix socket path")
	f.StringVar(&cfg.SocketGroup, "socket-group", cfg.SocketGroup, "group that owns the socket (mode 0660)")
	f.StringVar(&cfg.Node, "node", cfg.Node, "node name (default: hostname)")
	f.StringVar(&cfg.GPU, "gpu", cfg.GPU, "GPU backend: nvml, sim:N, replay:FILE, or auto (nvml if a GPU is found)")
	f.DurationVar(&cfg.Interval, "interval", cfg.Interval, "GPU sampling interval")
	f.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "default warmup excluded from efficiency figures")
	f.DurationVar(&cfg.HostInterval, "host-interval", cfg.HostInterval, "host RAM/CPU sampling interval")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.DurationVar(&shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown may take to flush batches to the collector")
	return cmd
}

// overlayFlags copies the flags that were set on the command line over dst.
func overlayFlags(cmd *cobra.Command, dst *agent.Config, flags agent.Config) {
	set := func(name string, apply func()) {
		if cmd.Flags().Changed(name) {
			apply()
		}
	}
	set("collector", func() { dst.Collector = flags.Collector })
	set("socket", func() { dst.Socket = flags.Socket })
	set("socket-group", func() { dst.SocketGroup = flags.SocketGroup })
	set("node", func() { dst.Node = flags.Node })
	set("gpu", func() { dst.GPU = flags.GPU })
	set("interval", func() { dst.Interval = flags.Interval })
	set("warmup", func() { dst.Warmup = flags.Warmup })
	set("host-interval", func() { dst.HostInterval = flags.HostInterval })
	set("log-level", func() { dst.LogLevel = flags.LogLevel })
}

func run(ctx context.Context, cfg agent.Config, shutdownTimeout time.Duration) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	backend, err := gpuopen.Open(cfg.GPU, logger)
	if err != nil {
		return err
	}
	defer backend.Close()

	a, err := agent.New(cfg, backend, clock.Real{}, host.NewGopsutil(), logger)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
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
