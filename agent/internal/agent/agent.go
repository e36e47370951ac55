// Package agent wires the trainmeter agent together: the GPU sampling loop,
// host sampling, the trainer socket, the run ledger and the collector uplink.
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/host"
	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/owner"
	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/agent/internal/trainersock"
	"github.com/trainmeter/trainmeter/agent/internal/uplink"
	"github.com/trainmeter/trainmeter/internal/buildinfo"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/gpu"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Version is the agent's version (internal/buildinfo: set at link time,
// else from the build's VCS stamp).
var Version = buildinfo.Version()

// Agent is one node's trainmeter agent.
type Agent struct {
	cfg     agentconfig.Config
	backend gpu.Backend
	clock   clock.Clock
	host    host.Sampler
	log     *slog.Logger

	ledger  *ledger.Ledger
	sock    *trainersock.Server
	up      *uplink.Group // to the collector, to each of a pair, or to one of replicas
	advised *adviceDedup  // advice and stop sent by both of a pair, once
	spool   *spool.Spool  // batches until acked; it owns the boot id and seqs
	state   *stateSlots   // the ledger's checkpoints
	// endedSaved is the version of the ledger's ended runs last saved
	// (endedFile); endedSavedOK whether any was.
	endedSaved   uint64
	endedSavedOK bool
	lastStateErr time.Time // rate-limits warnings about the ledger state

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	loopDone chan struct{} // closed when the sampling loop has stopped
	stopLoop chan struct{}
	// garbledLogAt is the count of garbled GPU readings logged next (the
	// sampling loop's own).
	garbledLogAt uint64

	self      *selfStats // status.go
	statusSrv *http.Server
	statusLn  net.Listener
	admit     admission // bounds the events per batch

	// GPU attribution by process tree (attribute.go); nil procs: the
	// backend cannot list GPU processes.
	procs       gpu.ProcessLister
	migs        gpu.MIGProcessLister // nil: the backend cannot tell MIG devices
	procRoot    string
	lastProcErr time.Time
	owned       owners            // the runs of GPU processes' owners (owned.go)
	k8s         *owner.Kubernetes // the Kubernetes source, nil when not used
	// Splitting shared GPUs (share.go): per-process or per-run use.
	procUse     gpu.ProcessUsageReader
	runUse      gpu.RunUsageReader
	lastUsePoll time.Time
	lastUseErr  time.Time
	// shareKick asks for a sharing poll now: a run start may make a GPU
	// shared, and the window it starts in is split by the work known when
	// the window closes (equally when none), so waiting for the next
	// tick could leave that window's split to chance.
	shareKick chan struct{}

	hostEnergy *hostEnergy            // RAPL CPU/DRAM energy (hostenergy.go)
	otel       *otelexport.Exporter   // direct OTel export; nil when off
	gpuMetrics *otelexport.GPUMetrics // its GPU metrics
}

// New builds an agent over a GPU backend; hostSampler may be nil.
func New(cfg agentconfig.Config, backend gpu.Backend, clk clock.Clock, hostSampler host.Sampler, logger *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	a := &Agent{cfg: cfg, backend: backend, clock: clk, host: hostSampler, log: logger,
		loopDone: make(chan struct{}), stopLoop: make(chan struct{}), garbledLogAt: 1, self: newSelfStats(clk.Now()),
		shareKick: make(chan struct{}, 1)}
	lcfg := ledger.Config{
		Devices:            backend.Devices(),
		DefaultWarmup:      cfg.Warmup,
		DefaultWarmupSteps: cfg.WarmupSteps,
		MaxGap:             max(5*cfg.Interval, 250*time.Millisecond),
		Logger:             logger,
		RawSamples:         cfg.RawSamples,
		ProcessAttribution: a.initAttribution(backend),
	}
	lcfg.Load, _ = backend.(gpu.LoadSetter)
	a.ledger = ledger.New(lcfg)
	a.openHostEnergy(nil)

	sp, err := spool.OpenWith(cfg.Spool, cfg.SpoolMaxBytes, spool.Options{Logger: logger, Collectors: cfg.SpoolCursors()})
	if err != nil {
		return nil, err
	}
	a.spool = sp
	built := false
	defer func() {
		if !built {
			_ = a.state.close()
			_ = sp.Close()
		}
	}()
	if err := a.restoreLedger(); err != nil {
		return nil, err
	}

	sock, err := trainersock.New(trainersock.Config{Path: cfg.Socket, Group: cfg.SocketGroup, AllowedUIDs: allowedUIDs(cfg),
		MaxConnsPerUID: cfg.SocketMaxConnsPerUID, IdleTimeout: socketIdleTimeout(cfg.SocketIdleTimeout), Clock: clk}, handler{a}, logger)
	if err != nil {
		return nil, err
	}
	a.sock = sock

	ucfg := uplink.Config{Hello: a.hello(), Logger: logger, Clock: clk}
	if err := securityConfig(cfg, &ucfg, logger); err != nil {
		return nil, err
	}
	a.advised = newAdviceDedup(clk)
	addrs := cfg.Collectors()
	if cfg.AnyCollector() {
		addrs = cfg.AnyOrder()
	}
	up, err := uplink.NewGroup(a.spool, addrs, cfg.AnyCollector(), ucfg, a.adviseFrom)
	if err != nil {
		return nil, err
	}
	a.up = up
	a.self.watchCollectors(len(up.Uplinks()), clk.Now())
	built = true
	return a, nil
}

func (a *Agent) hello() *trainmeterv1.Hello {
	h := &trainmeterv1.Hello{
		Node:         a.cfg.Node,
		BootId:       a.spool.BootID(), // persisted: a restarted agent re-sends under the same id
		AgentVersion: Version,
		GpuBackend:   a.cfg.GPU,
		StartedAt:    timestamppb.New(a.clock.Now()),
		// The spool's in-doubt loss records name their batch's window
		// (DataLoss.window_start), so the collector needs no dedup mark
		// per batch to check them.
		LossWindowStart: true,
	}
	h.HostEnergyStatus, _ = a.hostEnergyStatus()
	for _, d := range a.backend.Devices() {
		h.Gpus = append(h.Gpus, &trainmeterv1.GpuInfo{
			Index: uint32(d.Index), Uuid: d.UUID, Name: d.Name, MemoryTotalMib: d.MemTotalMiB,
			PowerLimitW: d.PowerLimitW, HasEnergyCounter: d.HasEnergyCounter, HasInstantPower: d.HasInstantPower,
			Vendor: d.Vendor,
		})
	}
	return h
}

// Start opens the trainer socket and starts sampling and the uplink.
func (a *Agent) Start(ctx context.Context) error {
	if err := a.sock.Start(ctx); err != nil {
		return fmt.Errorf("trainer socket: %w", err)
	}
	err := a.startStatus()
	if err == nil {
		err = a.startOTel(ctx)
	}
	if err == nil {
		err = a.up.Start(ctx)
	}
	if err != nil { // what started stops; the stops of the rest do nothing
		a.stopStatus(ctx)
		_ = a.stopOTel(ctx)
		_ = a.sock.Shutdown(context.WithoutCancel(ctx))
		return err
	}
	ctx, a.cancel = context.WithCancel(context.WithoutCancel(ctx))
	// RAPL keeps a ticker of its own (1 s): a read can take milliseconds
	// (each zone's file, and /proc while runs share the node), which the
	// 50 ms GPU loop must not wait for. Only nodes with readable RAPL have it.
	if a.hostEnergy.reader != nil {
		a.goPoll(ctx, a.cfg.HostInterval, a.pollHostEnergy, nil)
	}
	if a.initSharing() {
		a.goPoll(ctx, shareEvery, a.pollSharing, a.shareKick)
	}
	if a.procs != nil {
		a.goPoll(ctx, attributeEvery, a.pollAttribution, nil)
	}
	if a.k8s != nil {
		// Its own poll: a List, and the API server for a new pod, may take
		// seconds that the attribution poll must not wait for.
		a.goPoll(ctx, attributeEvery, func() { a.k8s.Refresh(ctx, a.clock.Now()) }, nil)
	}
	// The ticker exists before Start returns, so no tick (real or, in tests,
	// a fake clock's) can fall before the loop listens.
	go a.sampleLoop(a.clock.NewTicker(a.cfg.Interval))
	a.log.Info("agent started", "node", a.cfg.Node, "gpus", len(a.backend.Devices()), "backend", a.cfg.GPU,
		"socket", a.cfg.Socket, "collector", a.cfg.Collector, "interval", a.cfg.Interval, "warmup", a.cfg.Warmup)
	return nil
}

// goPoll calls poll every period, off the sampling loop, until ctx ends.
// The ticker is made before goPoll returns (see sampleLoop's).
// goPoll calls poll every interval, and at once on each receive from kick
// (nil: never).
func (a *Agent) goPoll(ctx context.Context, every time.Duration, poll func(), kick <-chan struct{}) {
	t := a.clock.NewTicker(every)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			case <-kick:
			}
			poll()
		}
	}()
}

func (a *Agent) sampleLoop(t clock.Ticker) {
	defer close(a.loopDone)
	defer t.Stop()
	samples := make([]gpu.Sample, len(a.backend.Devices()))
	failing := make([]bool, len(samples))
	// The host is sampled on this loop's ticks, not on a ticker of its own:
	// every timer is a wakeup of the process (and of the Go runtime's
	// threads), which is most of what an idle agent costs
	// (docs/benchmarks.md).
	var nextHost time.Time
	for {
		select {
		case <-a.stopLoop:
			return
		case <-t.C():
		}
		now := a.clock.Now()
		err := a.backend.Read(now, samples)
		if err != nil {
			a.log.Warn("GPU read failed", "err", err)
		}
		a.logGPUFailures(samples, failing)
		a.self.tick(now, a.cfg.Interval, samples, err)
		batches := a.ledger.Tick(now, samples)
		a.logGarbled()
		for _, b := range batches {
			a.gpuMetrics.Batch(a.cfg.Node, b)
			a.up.Enqueue(b)
		}
		if len(batches) > 0 {
			a.checkpoint(now)
			a.afterBatches(now)
		}
		// After the GPUs, so that reading /proc never delays a GPU sample.
		if a.host != nil && !now.Before(nextHost) {
			a.sampleHost()
			nextHost = now.Add(a.cfg.HostInterval)
		}
	}
}

// logGPUFailures logs a GPU's read errors once when they start (a GPU lost
// mid-run, a driver error) and once when they stop, not at every tick.
func (a *Agent) logGPUFailures(samples []gpu.Sample, failing []bool) {
	for i := range samples {
		s := &samples[i]
		switch {
		case s.Err != nil && !failing[i]:
			failing[i] = true
			a.log.Warn("GPU read failing (logged again only when it recovers); a GPU without power or energy readings counts as a gap (gap_s), the other GPUs go on",
				"gpu", i, "err", s.Err)
		case s.Err == nil && failing[i]:
			failing[i] = false
			a.log.Info("GPU reads again", "gpu", i)
		}
	}
}

// logGarbled logs the GPU readings dropped as ones no GPU gives at the
// 1st, 10th, 100th, … such reading: a driver that garbles a reading every
// tick must not flood the log.
func (a *Agent) logGarbled() {
	n := a.ledger.GarbledReadings()
	if n < a.garbledLogAt {
		return
	}
	a.log.Warn("GPU readings dropped as ones no GPU gives (NaN, negative, power above 20 kW, an all-ones value); each counts as a missing reading",
		"total", n)
	for a.garbledLogAt <= n {
		a.garbledLogAt *= 10
	}
}

func (a *Agent) sampleHost() {
	r, err := a.host.Read()
	if err != nil {
		a.log.Debug("host read failed", "err", err)
		return
	}
	a.ledger.SetHost(&trainmeterv1.HostWindow{MemoryUsedMib: r.MemUsedMiB, MemoryTotalMib: r.MemTotalMiB, CpuPct: r.CPUPct, CpuCount: uint32(r.CPUCount)})
}

// Shutdown closes the trainer socket (ending the runs it carried), keeps
// sampling until their last windows are out, flushes the uplink and stops.
// ctx bounds the whole shutdown.
func (a *Agent) Shutdown(ctx context.Context) error {
	var errs []error
	if err := a.sock.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("trainer socket: %w", err))
	}
	// The runs end on the sampling loop's ticks, which the injected clock
	// drives; poll on the same clock.
	for len(a.ledger.ActiveRuns()) > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-a.clock.After(50 * time.Millisecond):
		}
	}
	close(a.stopLoop)
	<-a.loopDone
	// The loop wrote the last checkpoint.
	if err := a.state.close(); err != nil {
		errs = append(errs, fmt.Errorf("ledger state: %w", err))
	}
	if err := a.up.Flush(ctx); err != nil {
		errs = append(errs, fmt.Errorf("uplink: batches not acked at shutdown: %w", err))
	}
	if err := a.up.Shutdown(ctx); err != nil {
		errs = append(errs, err)
	}
	a.cancel()
	a.wg.Wait()
	if a.k8s != nil {
		_ = a.k8s.Close()
	}
	a.stopStatus(ctx)
	if err := a.stopOTel(ctx); err != nil {
		errs = append(errs, err)
	}
	// Unacked batches stay in the spool (fsynced here) for the next start.
	if err := a.spool.Close(); err != nil {
		errs = append(errs, fmt.Errorf("spool: %w", err))
	}
	return errors.Join(errs...)
}

// adviseFrom passes an advisory from the collector-th collector on to the
// run's trainers, unless the other of a pair already sent the same.
func (a *Agent) adviseFrom(collector int, adv *trainmeterv1.Advisory) {
	if !a.advised.first(collector, adv) {
		a.log.Debug("advisory already delivered from the other collector; not repeated", "run_id", adv.RunId, "collector", collector)
		return
	}
	a.advise(adv)
}

func (a *Agent) advise(adv *trainmeterv1.Advisory) {
	var line []byte
	switch x := adv.Advice.(type) {
	case *trainmeterv1.Advisory_Stop:
		a.ledger.StopRequested(adv.RunId, x.Stop.Reason)
		line = trainerproto.StopLine(adv.RunId, x.Stop.Reason)
	case *trainmeterv1.Advisory_StartRefused:
		a.refused(adv.RunId, x.StartRefused)
		return
	case *trainmeterv1.Advisory_Dataloader:
		line = trainerproto.AdviceLine(adv.RunId, x.Dataloader)
	default:
		return
	}
	for _, c := range a.ledger.Members(adv.RunId) {
		if !a.sock.Send(c, line) {
			a.log.Warn("advisory dropped: trainer connection gone or not reading", "run_id", adv.RunId, "conn", c)
		}
	}
}

// refused acts on the collector's refusal of a run's start: the run is
// dropped from the ledger (nothing more of it is sent) and its trainers on
// this node get the collector's reason as an error line, as they would the
// agent's own refusal. A refusal repeated (by the other collector of a
// pair, or with a later batch) finds no such run and changes nothing.
func (a *Agent) refused(id string, r *trainmeterv1.StartRefused) {
	conns, dropped := a.ledger.Refuse(id, r.GetStart().AsTime())
	if !dropped {
		a.log.Debug("refusal for a run no longer on this node (already dropped, or ended)", "run_id", id)
		return
	}
	a.log.Warn("the collector refused the run's start", "run_id", id, "reason", r.GetReason(), "trainers", len(conns))
	line := trainerproto.ErrorLine(r.GetReason(), 0)
	for _, c := range conns {
		if !a.sock.Send(c, line) {
			a.log.Warn("refusal not passed to the trainer: connection gone or not reading", "run_id", id, "conn", c)
		}
	}
}

// handler adapts socket events to the ledger, stamping them with the clock.
type handler struct{ a *Agent }

func (h handler) Handle(p trainersock.Peer, ev trainerproto.Event) error {
	now := h.a.clock.Now()
	lp := ledger.Peer{ConnID: p.ConnID, PID: p.PID, UID: p.UID}
	switch e := ev.(type) {
	case *trainerproto.RunStart:
		if h.a.ledger.Members(e.Run) == nil { // a new run: one event, one more window per batch
			if n := len(h.a.ledger.ActiveRuns()); n >= maxActiveRuns {
				return fmt.Errorf("run_start: too many runs on this node (%d); end some first", n)
			}
			if !h.a.admit.allow(now, eventSize(e)) {
				return fmt.Errorf("run_start: agent busy: more than %d events/s from trainers; retry later", maxEventsPerSec)
			}
		}
		h.a.checkAttributePID(lp, e)
		e.Start.Attribution = owner.AttrRun
		h.a.ownerFirst(now, lp, e)
		err := h.a.ledger.StartRun(now, lp, e)
		if err == nil {
			h.a.kickSharing()
		}
		var mc *ledger.MetadataConflict
		if errors.As(err, &mc) && mc.StarterFound {
			// `trainmeter run` shows it on its stderr: the user reads that,
			// rarely the script client's errors().
			if !h.a.sock.Send(mc.StarterConn, trainerproto.ErrorLine(mc.StarterMessage(), 0)) {
				h.a.log.Warn("metadata conflict not passed to trainmeter run: connection gone or not reading", "run_id", e.Run)
			}
		}
		return err
	case *trainerproto.Step:
		return h.a.ledger.Step(now, lp, e)
	case *trainerproto.Eval:
		if !h.a.admit.allow(now, eventSize(e)) {
			return fmt.Errorf("eval: agent busy: more than %d events/s from trainers; dropped", maxEventsPerSec)
		}
		return h.a.ledger.Eval(now, lp, e)
	case *trainerproto.RunEnd:
		return h.a.ledger.EndRun(now, lp, e)
	}
	return fmt.Errorf("%s: not handled by this agent", ev.Kind())
}

func (h handler) Disconnected(p trainersock.Peer) {
	h.a.ledger.Disconnected(h.a.clock.Now(), ledger.Peer{ConnID: p.ConnID, PID: p.PID, UID: p.UID})
}

var _ lifecycle.Component = (*Agent)(nil)

// socketIdleTimeout maps the configuration's "0: never" to trainersock's
// "negative: off" (its zero is the default).
func socketIdleTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// kickSharing asks the sharing poller for a poll now, without waiting.
func (a *Agent) kickSharing() {
	select {
	case a.shareKick <- struct{}{}:
	default:
	}
}
