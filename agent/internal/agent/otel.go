package agent

import (
	"context"
	"fmt"
	"os"

	"github.com/trainmeter/trainmeter/pkg/otelexport"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// startOTel starts the direct OTel export of this node's GPUs (hw.*), for
// users without a trainmeter collector's export; off unless configured.
func (a *Agent) startOTel(ctx context.Context) error {
	if !a.cfg.OTel.Enabled() {
		return nil
	}
	host, _ := os.Hostname()
	exp, err := otelexport.Start(ctx, a.cfg.OTel, otelexport.Resource{
		ServiceName: "trainmeter-agent", ServiceVersion: Version, InstanceID: a.cfg.Node, HostName: host,
	}, a.log)
	if err != nil {
		return fmt.Errorf("otel export: %w", err)
	}
	gpus := a.hello().GetGpus()
	inventory := map[string][]*trainmeterv1.GpuInfo{a.cfg.Node: gpus}
	gm, err := otelexport.NewGPUMetrics(exp.Meter(), otelexport.GPUOptions{
		Clock:     a.clock,
		Inventory: func() map[string][]*trainmeterv1.GpuInfo { return inventory },
	})
	if err != nil {
		_ = exp.Shutdown(ctx)
		return fmt.Errorf("otel export: %w", err)
	}
	a.otel, a.gpuMetrics = exp, gm
	return nil
}

// stopOTel pushes the last figures and stops the export.
func (a *Agent) stopOTel(ctx context.Context) error {
	if a.otel == nil {
		return nil
	}
	if err := a.otel.Shutdown(ctx); err != nil {
		return fmt.Errorf("otel export: %w", err)
	}
	return nil
}
