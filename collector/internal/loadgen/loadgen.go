// Package loadgen drives a collector with simulated agents over real gRPC
// and measures what it sustains: every simulated agent opens its own ingest
// stream, sends a Hello, then one numbered batch per interval (GPUs
// GpuWindows, one RunWindow and a HostWindow: what a real agent sends every
// second) and waits for its ack before the next, exactly like the agent's
// uplink. It reports acked GPU-samples per second, ack latency quantiles, how
// many ticks an agent could not send on time (its previous batch was still
// unacked), and the collector process's CPU seconds over the measurement.
package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/internal/flowcontrol"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Config says what load to generate.
type Config struct {
	// Addrs are the collectors' HOST:PORTs: replicas sharing one store.
	// Agent i sends to Addrs[i % len(Addrs)] only, as an agent with
	// --collector-mode any stays on the replica it reached.
	Addrs  []string
	Agents int // simulated agents, one stream each
	GPUs   int // GPUs per agent (GpuWindows per batch)
	// Runs is the number of distinct runs the agents report; agent i
	// reports run i % Runs. 0 means one run per agent.
	Runs     int
	Interval time.Duration // each agent's batch cadence (1 s like the real agent)
	Duration time.Duration // how long to measure, after every agent is connected
	// Conns is how many HTTP/2 connections the streams are spread over (a
	// few dozen keep one from being the bottleneck), divided among Addrs.
	// 0: min(Agents, 64).
	Conns int
	// PIDs are the collector processes whose CPU time and resident memory
	// are reported, summed (Linux /proc).
	PIDs []int
	// DBPID, when non-zero, is the PostgreSQL postmaster of the collectors'
	// store: its CPU time and its children's (backends and background
	// workers, ProcTreeCPU) are counted as the database's.
	DBPID     int
	RunPrefix string // prefixes node and run names, so that load runs do not mix
	// RawSamples adds that many raw samples per GPU to every batch (an
	// agent with --raw-samples sends 20 per GPU for 1 s at 50 ms).
	RawSamples int
	// OTLP sends the same GPU samples as OTLP metrics (Export calls of the
	// OTLP MetricsService, see OTLPRequest) instead of trainmeter batches,
	// for comparison with an OpenTelemetry Collector.
	OTLP bool
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(len(c.Addrs) == 0 || slices.Contains(c.Addrs, ""), "a collector address is empty")
	check(c.Agents < 1, "agents must be >= 1, got %d", c.Agents)
	check(c.GPUs < 1 || c.GPUs > 1024, "gpus must be in 1..1024, got %d", c.GPUs)
	check(c.Runs < 0, "runs must be >= 0, got %d", c.Runs)
	check(c.Interval <= 0, "interval must be > 0, got %v", c.Interval)
	check(c.Duration <= 0, "duration must be > 0, got %v", c.Duration)
	check(c.RawSamples < 0 || c.RawSamples > 100000, "raw samples must be in 0..100000, got %d", c.RawSamples)
	check(c.Conns < 0, "conns must be >= 0, got %d", c.Conns)
	return errors.Join(errs...)
}

// Result is what one load run measured.
type Result struct {
	Agents, GPUs, Runs int
	Interval           time.Duration
	Elapsed            time.Duration // measured span
	Acked              uint64        // batches acked within the span
	Rejected           uint64
	LateTicks          uint64 // ticks an agent skipped: its previous batch was not acked yet
	StreamErrors       uint64
	AckP50, AckP99     time.Duration
	AckMax             time.Duration
	// Offered is the GPU-samples/s the agents would send if every tick went
	// out; GPUSamplesPerSec is what was acked.
	Offered, GPUSamplesPerSec float64
	// CollectorCPU is the collectors' user+system CPU time over the span
	// (zero without Config.PIDs), CollectorRSSMiB their resident memory at
	// the end, summed.
	CollectorCPU    time.Duration
	CollectorRSSMiB float64
	// DatabaseCPU is the PostgreSQL server's CPU time over the span (zero
	// without Config.DBPID).
	DatabaseCPU time.Duration
	// AckedPerReplica is Acked by the replica the agents sent to, in the
	// order of Config.Addrs.
	AckedPerReplica []uint64
	// RawPerGPU is Config.RawSamples; RawSamplesPerSec the raw samples
	// acked per second.
	RawPerGPU        int
	RawSamplesPerSec float64
}

// Sustained reports whether the collector kept up: at least 99 % of the
// offered load was acked and no stream failed.
func (r Result) Sustained() bool {
	return r.StreamErrors == 0 && r.Rejected == 0 && r.GPUSamplesPerSec >= 0.99*r.Offered
}

// SamplesPerCPUSecond is acked GPU-samples per CPU-second of the
// collectors and the database together.
func (r Result) SamplesPerCPUSecond() float64 {
	cpu := r.CollectorCPU + r.DatabaseCPU
	if cpu <= 0 {
		return 0
	}
	return float64(r.Acked) * float64(r.GPUs) / cpu.Seconds()
}

func (r Result) String() string {
	s := fmt.Sprintf("agents=%d gpus/agent=%d runs=%d interval=%v elapsed=%.1fs acked=%d rejected=%d late_ticks=%d stream_errors=%d "+
		"offered=%.0f gpu-samples/s acked=%.0f gpu-samples/s ack_p50=%.1fms ack_p99=%.1fms ack_max=%.1fms sustained=%v",
		r.Agents, r.GPUs, r.Runs, r.Interval, r.Elapsed.Seconds(), r.Acked, r.Rejected, r.LateTicks, r.StreamErrors,
		r.Offered, r.GPUSamplesPerSec, ms(r.AckP50), ms(r.AckP99), ms(r.AckMax), r.Sustained())
	if r.RawPerGPU > 0 {
		s += fmt.Sprintf(" raw_samples/gpu/batch=%d raw_gpu-samples/s=%.0f", r.RawPerGPU, r.RawSamplesPerSec)
		if r.CollectorCPU > 0 {
			s += fmt.Sprintf(" raw_gpu-samples/cpu-s=%.0f", float64(r.Acked)*float64(r.GPUs*r.RawPerGPU)/r.CollectorCPU.Seconds())
		}
	}
	if len(r.AckedPerReplica) > 1 {
		s += fmt.Sprintf(" acked_per_replica=%v", r.AckedPerReplica)
	}
	if r.DatabaseCPU > 0 {
		s += fmt.Sprintf(" database_cpu=%.2fs (%.1f%% of one core)", r.DatabaseCPU.Seconds(), 100*r.DatabaseCPU.Seconds()/r.Elapsed.Seconds())
	}
	if r.CollectorCPU > 0 {
		s += fmt.Sprintf(" collector_cpu=%.2fs (%.1f%% of one core) gpu-samples/cpu-s=%.0f collector_rss=%.0fMiB",
			r.CollectorCPU.Seconds(), 100*r.CollectorCPU.Seconds()/r.Elapsed.Seconds(), r.SamplesPerCPUSecond(), r.CollectorRSSMiB)
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// agentStats is one simulated agent's tally over the measured span.
type agentStats struct {
	acked, rejected, late uint64
	lat                   []time.Duration
	err                   error
}

// Run generates the load until ctx ends or Duration has been measured.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	runs, nrep := cmp.Or(cfg.Runs, cfg.Agents), len(cfg.Addrs)
	perRep := max(1, cmp.Or(cfg.Conns, min(cfg.Agents, 64))/nrep)
	conns := make([][]*grpc.ClientConn, nrep)
	for r, addr := range cfg.Addrs {
		for range perRep {
			// Like the agent's uplink (and, for the OTLP comparison, the
			// same for the OTel Collector's clients).
			c, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, flowcontrol.DialOptions()...)...)
			if err != nil {
				return Result{}, err
			}
			defer c.Close()
			conns[r] = append(conns[r], c)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Phases: agents connect (Hello) and report ready; when all are, the
	// measured span starts; each agent counts only acks inside it.
	sp := &span{start: make(chan struct{})}
	sp.ready.Add(cfg.Agents)
	stats := make([]agentStats, cfg.Agents)
	var done sync.WaitGroup
	for i := 0; i < cfg.Agents; i++ {
		done.Add(1)
		go func() {
			defer done.Done()
			a := &simAgent{cfg: cfg, id: i, run: fmt.Sprintf("%srun-%06d", cfg.RunPrefix, i%runs)}
			a.loop(ctx, conns[i%nrep][i/nrep%perRep], sp, &stats[i])
		}()
	}
	readyCh := make(chan struct{})
	go func() { sp.ready.Wait(); close(readyCh) }()
	select {
	case <-readyCh:
	case <-ctx.Done():
		cancel()
		done.Wait()
		return Result{}, fmt.Errorf("agents did not all connect: %w", firstErr(stats, ctx.Err()))
	}

	cpu0, db0 := procsCPU(cfg.PIDs), treeCPU(cfg.DBPID)
	t0 := time.Now()
	sp.from.Store(t0.UnixNano())
	sp.to.Store(t0.Add(cfg.Duration).UnixNano())
	close(sp.start)
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
	}
	elapsed := time.Since(t0)
	cpu1, db1 := procsCPU(cfg.PIDs), treeCPU(cfg.DBPID)
	var rss float64
	for _, pid := range cfg.PIDs {
		m, _ := ProcRSS(pid)
		rss += m
	}
	cancel()
	done.Wait()

	res := Result{Agents: cfg.Agents, GPUs: cfg.GPUs, Runs: runs, Interval: cfg.Interval, Elapsed: elapsed,
		CollectorCPU: cpu1 - cpu0, CollectorRSSMiB: rss, DatabaseCPU: db1 - db0, AckedPerReplica: make([]uint64, nrep)}
	var lat []time.Duration
	for i := range stats {
		st := &stats[i]
		res.Acked += st.acked
		res.AckedPerReplica[i%nrep] += st.acked
		res.Rejected += st.rejected
		res.LateTicks += st.late
		if st.err != nil {
			res.StreamErrors++
		}
		lat = append(lat, st.lat...)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		res.AckP50 = lat[len(lat)/2]
		res.AckP99 = lat[min(len(lat)-1, len(lat)*99/100)]
		res.AckMax = lat[len(lat)-1]
	}
	res.Offered = float64(cfg.Agents*cfg.GPUs) / cfg.Interval.Seconds()
	res.GPUSamplesPerSec = float64(res.Acked) * float64(cfg.GPUs) / elapsed.Seconds()
	res.RawPerGPU = cfg.RawSamples
	res.RawSamplesPerSec = res.GPUSamplesPerSec * float64(cfg.RawSamples)
	if res.StreamErrors > 0 {
		return res, fmt.Errorf("%d of %d streams failed, first: %w", res.StreamErrors, cfg.Agents, firstErr(stats, nil))
	}
	return res, nil
}

func firstErr(stats []agentStats, def error) error {
	for i := range stats {
		if stats[i].err != nil {
			return stats[i].err
		}
	}
	return def
}

// span is the measured span that every simulated agent shares: each is
// ready once its link works, and counts answers inside [from, to].
type span struct {
	ready    sync.WaitGroup
	start    chan struct{}
	from, to atomic.Int64
}

type simAgent struct {
	cfg Config
	id  int
	run string
	seq uint64
}

// loop connects, sends the first batch (with the run start) before the
// measured span, so every agent has proved its link works when it begins,
// then one batch per interval until ctx ends.
func (a *simAgent) loop(ctx context.Context, conn *grpc.ClientConn, sp *span, st *agentStats) {
	readyOnce := sync.OnceFunc(sp.ready.Done)
	defer readyOnce()
	connect := a.connect
	if a.cfg.OTLP {
		connect = a.connectOTLP
	}
	send, err := connect(ctx, conn)
	if err == nil {
		_, err = send(time.Now(), true)
	}
	if err != nil {
		st.err = err
		return
	}
	readyOnce()
	select {
	case <-sp.start:
	case <-ctx.Done():
		return
	}
	a.ticks(ctx, sp, st, func(sent time.Time) (bool, error) { return send(sent, false) })
}

// ticks calls send once per interval until ctx ends, counting answers,
// latencies and late ticks inside the measured span.
func (a *simAgent) ticks(ctx context.Context, sp *span, st *agentStats, send func(time.Time) (acked bool, err error)) {
	// Spread the agents' ticks over the interval, like a real fleet.
	phase := time.Duration(rand.Int64N(int64(a.cfg.Interval)))
	next := time.Now().Add(phase)
	timer := time.NewTimer(phase)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		sent := time.Now()
		ok, err := send(sent)
		if err != nil {
			if ctx.Err() == nil {
				st.err = err
			}
			return
		}
		acked := time.Now()
		if acked.UnixNano() <= sp.to.Load() && sent.UnixNano() >= sp.from.Load() {
			if ok {
				st.acked++
				st.lat = append(st.lat, acked.Sub(sent))
			} else {
				st.rejected++
			}
		}
		next = next.Add(a.cfg.Interval)
		for !next.After(acked) { // ticks missed while waiting for the ack
			next = next.Add(a.cfg.Interval)
			if next.UnixNano() <= sp.to.Load() {
				st.late++
			}
		}
		timer.Reset(time.Until(next))
	}
}

// sendFunc sends the agent's next batch and reports whether it was acked.
type sendFunc func(now time.Time, first bool) (acked bool, err error)

// connect opens the agent's ingest stream and sends its Hello. The stream
// ends with ctx.
func (a *simAgent) connect(ctx context.Context, conn *grpc.ClientConn) (sendFunc, error) {
	stream, err := trainmeterv1.NewIngestServiceClient(conn).Stream(ctx)
	if err != nil {
		return nil, err
	}
	node := fmt.Sprintf("%snode-%06d", a.cfg.RunPrefix, a.id)
	gpus := make([]*trainmeterv1.GpuInfo, a.cfg.GPUs)
	for g := range gpus {
		gpus[g] = &trainmeterv1.GpuInfo{Index: uint32(g), Name: "Sim H100", MemoryTotalMib: 81559, PowerLimitW: 700,
			HasEnergyCounter: true, HasInstantPower: true, Uuid: fmt.Sprintf("GPU-%06d-%02d", a.id, g)}
	}
	boot := fmt.Sprintf("boot-%d", time.Now().UnixNano())
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: &trainmeterv1.Hello{
		Node: node, BootId: boot, AgentVersion: "loadgen", Gpus: gpus, GpuBackend: "sim", StartedAt: timestamppb.Now(),
		LossWindowStart: true}}}); err != nil { // as the current agent says (its batches need no dedup mark)
		return nil, err
	}
	return func(now time.Time, first bool) (bool, error) {
		a.seq++
		b := MakeBatch(a.seq, now, a.cfg.Interval, a.run, a.cfg.GPUs, first)
		AddRawSamples(b, a.cfg.RawSamples)
		resp, err := roundTrip(stream, b)
		return resp.GetAck() != nil, err
	}, nil
}

// connectOTLP is connect for OTLP mode: one Export call per batch, answered
// when the receiver has taken the data.
func (a *simAgent) connectOTLP(ctx context.Context, conn *grpc.ClientConn) (sendFunc, error) {
	client := colmetricspb.NewMetricsServiceClient(conn)
	node := fmt.Sprintf("%snode-%06d", a.cfg.RunPrefix, a.id)
	return func(now time.Time, _ bool) (bool, error) {
		a.seq++
		_, err := client.Export(ctx, OTLPRequest(node, MakeBatch(a.seq, now, a.cfg.Interval, a.run, a.cfg.GPUs, false)))
		return true, err
	}, nil
}

// roundTrip sends batch b and waits for its answer (an ack or a reject;
// advisories are skipped).
func roundTrip(stream grpc.BidiStreamingClient[trainmeterv1.StreamRequest, trainmeterv1.StreamResponse],
	b *trainmeterv1.Batch) (*trainmeterv1.StreamResponse, error) {
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: b}}); err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("collector closed the stream")
		}
		if err != nil {
			return nil, err
		}
		if resp.GetAdvisory() == nil {
			return resp, nil
		}
	}
}

// MakeBatch builds batch seq of an agent with gpus GPUs all in run, for the
// window [now-interval, now): what the real agent sends every second. The
// first batch of an agent carries the run's start.
func MakeBatch(seq uint64, now time.Time, interval time.Duration, run string, gpus int, first bool) *trainmeterv1.Batch {
	start := now.Add(-interval)
	sec := interval.Seconds()
	b := &trainmeterv1.Batch{
		Seq: seq, WindowStart: timestamppb.New(start), WindowEnd: timestamppb.New(now),
		Host: &trainmeterv1.HostWindow{MemoryUsedMib: 120000, MemoryTotalMib: 2048000, CpuPct: 35, CpuCount: 96},
	}
	samples := uint32(max(1, interval/(50*time.Millisecond)))
	ids := make([]uint32, gpus)
	for g := 0; g < gpus; g++ {
		ids[g] = uint32(g)
		p := 550 + float64(g)
		b.GpuWindows = append(b.GpuWindows, &trainmeterv1.GpuWindow{
			Gpu: uint32(g), EnergyCounterJ: p * sec, CounterOk: true, EnergyIntegratedJ: p * sec * 0.998,
			PowerAvgW: p, PowerMaxW: p + 40, PowerLastW: p - 3, Samples: samples,
			MemoryUsedMaxMib: 70000, MemoryUsedAvgMib: 69000, MemoryTotalMib: 81559, UtilizationAvgPct: 97,
		})
	}
	ps := 550.0 * float64(gpus)
	b.RunWindows = []*trainmeterv1.RunWindow{{
		RunId: run, Start: timestamppb.New(start), End: timestamppb.New(now), Phase: trainmeterv1.Phase_PHASE_MEASURED,
		EnergyCounterJ: ps * sec, CounterOk: true, EnergyIntegratedJ: ps * sec * 0.998, PeakPowerW: ps + 300,
		VramPeakMib: 70000, VramSumMib: 69000 * float64(gpus) * float64(samples), VramSamples: uint64(gpus) * uint64(samples),
		GpuSeconds: float64(gpus) * sec, Tokens: 65536, TokensMeasured: 65536, Steps: 2, Samples: 32,
		DataWaitS: 0.02 * sec, ComputeS: 0.95 * sec, UtilizationSumPct: 97 * float64(gpus) * float64(samples), UtilizationSamples: uint64(gpus) * uint64(samples), Gpus: ids,
	}}
	if first {
		b.RunEvents = []*trainmeterv1.RunEvent{{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{
			RunId: run, Time: timestamppb.New(start), GpuName: "Sim H100", Gpus: ids,
			Metadata: &trainmeterv1.RunMetadata{Model: "llama-8b", Dataset: "c4", Backend: "torch", Precision: "bf16",
				BatchSize: proto.Int64(16), SeqLen: proto.Int64(4096)},
		}}}}
	}
	return b
}

// AddRawSamples adds n raw samples per GPU of b, evenly over its window.
func AddRawSamples(b *trainmeterv1.Batch, n int) {
	if n <= 0 {
		return
	}
	start := uint64(b.GetWindowStart().AsTime().UnixNano())
	step := max(1, uint64(b.GetWindowEnd().AsTime().Sub(b.GetWindowStart().AsTime()))/uint64(n))
	for _, g := range b.GetGpuWindows() {
		r := &trainmeterv1.RawSamples{Gpu: g.GetGpu(), TUnixNs: make([]uint64, n), PowerW: make([]float32, n),
			UtilizationPct: make([]float32, n), MemoryUsedMib: make([]float32, n)}
		for i := 0; i < n; i++ {
			r.TUnixNs[i] = start + uint64(i)*step
			r.PowerW[i] = float32(g.GetPowerAvgW()) + float32(i%7)
			r.UtilizationPct[i] = 97
			r.MemoryUsedMib[i] = 69000
		}
		b.RawSamples = append(b.RawSamples, r)
	}
}

// BatchApplier is what StoreRun needs of the collector's store
// (store.Store.ApplyBatch, what ingest calls).
type BatchApplier interface {
	ApplyBatch(node, boot string, b *trainmeterv1.Batch) (duplicate bool, err error)
}

// StoreRun stores run as one agent of gpus GPUs ("node-1", one boot, one
// sequence) would have sent it: a batch a second for seconds seconds from
// t0 (the first one starts the run). Batches go in from workers
// goroutines at once, each its own span of the run (the store's group
// commit writes those waiting in one transaction), so a day's run takes
// seconds to store, not minutes.
func StoreRun(st BatchApplier, run string, t0 time.Time, seconds, gpus, workers int) error {
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for s := w * seconds / workers; s < (w+1)*seconds/workers; s++ {
				batch := MakeBatch(uint64(s+1), t0.Add(time.Duration(s+1)*time.Second), time.Second, run, gpus, s == 0)
				if _, err := st.ApplyBatch("node-1", "boot", batch); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var errList []error
	for range workers {
		errList = append(errList, <-errs)
	}
	return errors.Join(errList...)
}
