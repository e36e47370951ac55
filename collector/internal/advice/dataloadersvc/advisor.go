// Package dataloadersvc is the collector's live dataloader advisor: it watches
// every applied batch, keeps per-(run, node) figures, evaluates the rules of
// collector/internal/advice/dataloader every adjustment_interval steps, sends new settings down
// the node's stream as a DataloaderAdvice, and records every evaluation and
// per-epoch statistics in the store (namespace "advice"), which package
// optimizer reads for `trainmeter report` and `trainmeter recommend`.
package dataloadersvc

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/advice/dataloader"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/internal/lifecycle"
)

// Namespace is the store record namespace of the advice history.
const Namespace = "advice"

// queueLen bounds the batches waiting for the advisor; beyond it batches
// are skipped (counted) rather than slowing ingestion down.
const queueLen = 1024

// idleAfter: a (run, node) that sent nothing for this long (batch time) is
// forgotten, so runs that never send run_end do not leak. The sweep visits
// every run, so it runs once per sweepEvery of batch time, not per batch.
const (
	idleAfter  = time.Hour
	sweepEvery = time.Minute
)

// Sender sends an advisory down a node's stream (ingest.Server.Advise).
type Sender interface {
	Advise(node string, adv *trainmeterv1.Advisory) bool
}

// runWindow is what the advisor keeps of one RunWindow.
type runWindow struct {
	run                        string
	start, end                 time.Time
	measured                   bool // after warmup
	tokens, steps, utilN       uint64
	dataWait, compute, utilSum float64
	gpus, stepRanks            int
}

// item is one batch, reduced to what the advisor reads (copied on the
// stream goroutine so the batch is never touched later).
type item struct {
	node    string
	end     time.Time
	windows []runWindow
	events  []*trainmeterv1.RunEvent
	host    *trainmeterv1.HostWindow
}

type key struct{ run, node string }

type epochAcc struct {
	dataWait, compute, utilSum, ramSum float64
	utilN, ramN                        uint64
	adjustments                        uint32
	// measuredTokens / measuredS: the node's windows after warmup that lie
	// wholly inside the epoch, for its throughput.
	measuredTokens uint64
	measuredS      float64
}

type runState struct {
	adv *dataloader.Advisor
	iv  dataloader.Interval
	// ivSteps: steps per rank in the interval (the window's steps ÷ its
	// step_ranks), what adjustment_interval counts.
	ivSteps  float64
	utilSum  float64
	utilN    uint64
	step     float64 // steps per rank seen on this node
	epoch    epochAcc
	lastSeen time.Time
	// lastEval is the epoch (epochs completed, 1-based) of the last
	// boundary, 0 before the first: the eval's epoch when it has one, else
	// the previous boundary's + 1. boundaries counts them.
	lastEval   int64
	boundaries int
	// closedSteps: steps per rank in the epochs closed on this node;
	// evalSteps: the rank_steps of the last boundary that carried one. An
	// epoch's steps come from the evals' rank_steps where they have them:
	// counting the 1 s windows would put the steps of the eval's second in
	// the wrong epoch (20 steps per epoch shown as 22 and 18).
	closedSteps float64
	evalSteps   uint64
	// lastCounted is the last window added to the epoch's throughput (an
	// eval inside it takes it out again); measuredFrom the last boundary: a
	// window starting before it straddles that boundary and counts in
	// neither epoch.
	lastCounted  *runWindow
	measuredFrom time.Time
	// reportedW / reportedP: the loader the trainer reported at the last
	// boundary, still in force (reportedOK) when no change was applied
	// there; the partial epoch at run_end then ran with it.
	reportedW, reportedP int
	reportedOK           bool
}

// Advisor is the live dataloader advisor.
type Advisor struct {
	st   storage.Store
	send Sender
	log  *slog.Logger

	queue chan item
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once

	runs map[key]*runState // owned by the worker goroutine
	// nodes indexes runs by run id: the nodes with a state for it, so an
	// epoch boundary reaches every node of the run.
	nodes     map[string]map[string]struct{}
	lastSweep time.Time // batch time of the last idle sweep

	skipped, sent atomic.Uint64
	processed     chan struct{} // test hook: signalled after each item (nil: off)
}

// New returns an advisor; Start it, and register Observe with the ingest
// server's OnApplied.
func New(st storage.Store, send Sender, log *slog.Logger) *Advisor {
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	return &Advisor{st: st, send: send, log: log, queue: make(chan item, queueLen), done: make(chan struct{}), runs: map[key]*runState{},
		nodes: map[string]map[string]struct{}{}}
}

// Start runs the worker goroutine.
func (a *Advisor) Start(context.Context) error {
	a.wg.Go(func() {
		for {
			select {
			case <-a.done:
				return
			case it := <-a.queue:
				a.process(it)
				if a.processed != nil {
					a.processed <- struct{}{}
				}
			}
		}
	})
	return nil
}

// Shutdown stops the worker, waiting for the batch in progress until ctx
// ends; batches still queued are dropped (advice is advisory: nothing is
// lost that the store does not hold).
func (a *Advisor) Shutdown(ctx context.Context) error {
	a.once.Do(func() { close(a.done) })
	stopped := make(chan struct{})
	go func() { a.wg.Wait(); close(stopped) }()
	return lifecycle.Wait(ctx, stopped, "dataloader advisor")
}

// Counts is how many recommendations the advisor has sent since it
// started, by kind (the trainmeter.recommendations counter; monotonic).
func (a *Advisor) Counts() map[string]int {
	return map[string]int{"dataloader": int(a.sent.Load())}
}

// Observe is the ingest.BatchObserver: it copies what it needs and queues
// it, never blocking.
func (a *Advisor) Observe(node string, b *trainmeterv1.Batch) {
	it := item{node: node, end: b.GetWindowEnd().AsTime(), host: b.GetHost()}
	for _, w := range b.GetRunWindows() {
		it.windows = append(it.windows, runWindow{
			run: w.GetRunId(), start: w.GetStart().AsTime(), measured: w.GetPhase() == trainmeterv1.Phase_PHASE_MEASURED, tokens: w.GetTokens(),
			steps: w.GetSteps(), dataWait: w.GetDataWaitS(), compute: w.GetComputeS(),
			utilSum: w.GetUtilizationSumPct(), utilN: w.GetUtilizationSamples(), gpus: len(w.GetGpus()), stepRanks: int(w.GetStepRanks()), end: w.GetEnd().AsTime(),
		})
	}
	for _, e := range b.GetRunEvents() {
		it.events = append(it.events, proto.Clone(e).(*trainmeterv1.RunEvent))
	}
	if it.host != nil {
		it.host = proto.Clone(it.host).(*trainmeterv1.HostWindow)
	}
	if len(it.windows) == 0 && len(it.events) == 0 {
		return
	}
	select {
	case a.queue <- it:
	default:
		a.skipped.Add(1)
	}
}

func configFromStart(rs *trainmeterv1.RunStart) dataloader.Config {
	return dataloader.Config{
		TargetGPUUtilization: rs.GetTargetGpuUtilization(), MaxRAMUsage: rs.GetMaxRamUsage(),
		Interval: rs.GetAdjustmentInterval(), NumWorkers: int(rs.GetNumWorkers()), PrefetchFactor: int(rs.GetPrefetchFactor()),
		HasNumWorkers: rs.NumWorkers != nil, Epochs: rs.GetPlannedEpochs() > 0,
	}
}

// state returns the (run, node) state, creating it from the run's plan in
// the store (a run whose run_start this advisor did not see, e.g. after a
// collector restart).
func (a *Advisor) state(run, node string, start *trainmeterv1.RunStart) *runState {
	k := key{run, node}
	if s := a.runs[k]; s != nil {
		return s
	}
	var cfg dataloader.Config
	if start != nil {
		cfg = configFromStart(start)
	} else if st, err := a.st.GetRun(run); err == nil {
		cfg = configFromStart(st.GetRunStart())
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		a.log.Warn("dataloader advice: bad targets in run_start; using defaults", "run_id", run, "err", err)
		cfg = dataloader.Config{NumWorkers: cfg.NumWorkers, PrefetchFactor: cfg.PrefetchFactor, HasNumWorkers: cfg.HasNumWorkers, Epochs: cfg.Epochs}
	}
	s := &runState{adv: dataloader.NewAdvisor(cfg)}
	a.runs[k] = s
	if a.nodes[run] == nil {
		a.nodes[run] = map[string]struct{}{}
	}
	a.nodes[run][node] = struct{}{}
	return s
}

// forget drops a (run, node) state.
func (a *Advisor) forget(k key) {
	delete(a.runs, k)
	delete(a.nodes[k.run], k.node)
	if len(a.nodes[k.run]) == 0 {
		delete(a.nodes, k.run)
	}
}

// epochBoundary passes an eval event to every node state of its run: the
// ranks on every node start a new epoch, not only those on the node of the
// rank that reported it (the integrations report from global rank 0 only).
// An eval with an epoch already seen on a node (another rank's eval of the
// same epoch) is no boundary there; an eval without an epoch always is.
func (a *Advisor) epochBoundary(e *trainmeterv1.Eval, recs map[string][]byte) {
	run := e.GetRunId()
	for _, node := range slices.Sorted(maps.Keys(a.nodes[run])) {
		s := a.runs[key{run, node}]
		epoch := s.lastEval + 1
		if e.Epoch != nil {
			if s.boundaries > 0 && e.GetEpoch() == s.lastEval {
				continue
			}
			epoch = e.GetEpoch()
		}
		s.lastEval = epoch
		s.boundaries++
		at := e.GetTime().AsTime()
		if w := s.lastCounted; w != nil && w.end.After(at) {
			s.epoch.measuredTokens -= w.tokens
			s.epoch.measuredS -= w.end.Sub(w.start).Seconds()
		}
		s.lastCounted, s.measuredFrom = nil, at
		// What the epoch ran with: what the trainer says, else what the
		// advisor believes (a change still pending is applied by the trainer
		// at this boundary, after the epoch). A report also corrects the
		// advisor's baseline where its belief was wrong.
		ranW, ranP := s.adv.InForce()
		s.reportedOK = e.LoaderNumWorkers != nil
		if s.reportedOK {
			ranW = int(e.GetLoaderNumWorkers())
			if p := e.GetLoaderPrefetchFactor(); p > 0 {
				ranP = int(p)
			}
			s.reportedW, s.reportedP = ranW, ranP
			s.adv.Rebase(ranW, int(e.GetLoaderPrefetchFactor()))
		}
		if s.adv.EpochBoundary() {
			s.reportedOK = false // the trainer switches now, to settings it has not reported yet
			// The trainer applies the last change now: the interval so far
			// measured the old settings.
			s.resetInterval()
		}
		// Without rank_steps (a sender whose count went back after an agent
		// restart) the windows' count is all there is.
		steps := s.step - s.closedSteps
		if rs := e.GetRankSteps(); rs > 0 && rs >= s.evalSteps {
			steps = float64(rs - s.evalSteps)
			s.evalSteps = rs
		}
		a.closeEpoch(run, node, s, epoch, steps, false, at, ranW, ranP, e.LoaderNumWorkers != nil, recs)
	}
}

// resetInterval starts a new evaluation interval.
func (s *runState) resetInterval() {
	s.iv, s.ivSteps = dataloader.Interval{}, 0
	s.utilSum, s.utilN = 0, 0
}

func (a *Advisor) process(it item) {
	var recs = map[string][]byte{}
	ram, hasRAM, cpus := hostFigures(it.host)
	// run_start first: it sets the config of a new state.
	for _, e := range it.events {
		if rs := e.GetRunStart(); rs != nil {
			a.state(rs.GetRunId(), it.node, rs)
		}
	}
	for _, w := range it.windows {
		s := a.state(w.run, it.node, nil)
		s.lastSeen = it.end
		s.countThroughput(w)
		if hasRAM && w.steps > 0 {
			s.epoch.ramSum += ram
			s.epoch.ramN++
		}
		if w.steps == 0 {
			continue
		}
		// Every rank on the node reports its own steps: count optimizer
		// steps, i.e. per rank (agents before step_ranks: one rank).
		ranks := max(1, w.stepRanks)
		perRank := float64(w.steps) / float64(ranks)
		s.step += perRank
		s.ivSteps += perRank
		s.iv.Steps += w.steps
		s.iv.DataWaitS += w.dataWait
		s.iv.ComputeS += w.compute
		s.utilSum += w.utilSum
		s.utilN += w.utilN
		if hasRAM {
			s.iv.HasRAM = true
			s.iv.RAMUsage = max(s.iv.RAMUsage, ram)
		}
		if cpus > 0 {
			s.iv.CPUCount = cpus
		}
		// The worker bound is per rank: the ranks that step when the agent
		// says, else one rank per GPU.
		s.iv.LocalRanks = max(s.iv.LocalRanks, cmp.Or(w.stepRanks, w.gpus))
		s.epoch.dataWait += w.dataWait
		s.epoch.compute += w.compute
		s.epoch.utilSum += w.utilSum
		s.epoch.utilN += w.utilN
		if s.ivSteps >= float64(s.adv.Config().Interval)-1e-9 {
			a.evaluate(w.run, it.node, s, w.end, recs)
		}
	}
	for _, e := range it.events {
		switch ev := e.GetEvent().(type) {
		case *trainmeterv1.RunEvent_Eval:
			a.epochBoundary(ev.Eval, recs)
		case *trainmeterv1.RunEvent_RunEnd:
			k := key{ev.RunEnd.GetRunId(), it.node}
			if s := a.runs[k]; s != nil {
				// run_end comes with the run's last window: every step is in.
				if rest := s.step - s.closedSteps; rest >= 0.5 {
					ranW, ranP := s.adv.InForce()
					if s.reportedOK {
						ranW, ranP = s.reportedW, s.reportedP
					}
					a.closeEpoch(k.run, it.node, s, s.lastEval+1, rest, true, ev.RunEnd.GetTime().AsTime(), ranW, ranP, s.reportedOK, recs)
				}
				a.forget(k)
			}
		}
	}
	if it.end.Sub(a.lastSweep) >= sweepEvery {
		a.lastSweep = it.end
		for k, s := range a.runs {
			if !s.lastSeen.IsZero() && it.end.Sub(s.lastSeen) > idleAfter {
				a.forget(k)
			}
		}
	}
	if len(recs) > 0 {
		if err := a.st.PutRecords(Namespace, recs); err != nil {
			a.log.Warn("dataloader advice: cannot store history", "err", err)
		}
	}
}

// countThroughput adds a window after warmup to the epoch's throughput,
// unless it began before the last epoch boundary (it ran partly in the
// previous epoch, maybe with other loader settings).
func (s *runState) countThroughput(w runWindow) {
	secs := w.end.Sub(w.start).Seconds()
	if !w.measured || secs <= 0 || w.start.Before(s.measuredFrom) {
		return
	}
	s.epoch.measuredTokens += w.tokens
	s.epoch.measuredS += secs
	s.lastCounted = &w
}

func hostFigures(h *trainmeterv1.HostWindow) (ram float64, ok bool, cpus int) {
	if h == nil {
		return 0, false, 0
	}
	if h.GetMemoryTotalMib() > 0 {
		ram, ok = h.GetMemoryUsedMib()/h.GetMemoryTotalMib(), true
	}
	return ram, ok, int(h.GetCpuCount())
}

func (a *Advisor) evaluate(run, node string, s *runState, at time.Time, recs map[string][]byte) {
	if s.utilN > 0 {
		s.iv.GPUUtilization = s.utilSum / float64(s.utilN) / 100
		s.iv.HasGPUUtilization = true
	}
	adv := s.adv.Evaluate(s.iv)
	s.resetInterval()
	gpuUtil, ramUse := -1.0, -1.0
	if adv.HasGPUUtilization {
		gpuUtil = adv.GPUUtilization
	}
	if adv.HasRAM {
		ramUse = adv.RAMUsage
	}
	ev := &trainmeterv1.DataloaderEvaluation{
		Node: node, Time: timestamppb.New(at), Step: uint64(math.Round(s.step)), Classification: string(adv.Class),
		NumWorkers: uint32(adv.NumWorkers), PrefetchFactor: uint32(adv.PrefetchFactor), Changed: adv.Changed,
		Reason: adv.Reason, DataWaitShare: adv.DataWaitShare, GpuUtilization: gpuUtil, RamUsage: ramUse,
		ExpectedGain: adv.ExpectedGain,
	}
	if adv.Changed {
		ev.Delivered = a.send.Advise(node, &trainmeterv1.Advisory{RunId: run, Advice: &trainmeterv1.Advisory_Dataloader{Dataloader: &trainmeterv1.DataloaderAdvice{
			NumWorkers: uint32(adv.NumWorkers), PrefetchFactor: uint32(adv.PrefetchFactor), Reason: adv.Reason,
			Classification: string(adv.Class), DataWaitShare: adv.DataWaitShare, GpuUtilization: gpuUtil,
			RamUsage: ramUse, ExpectedGain: adv.ExpectedGain, MaxWorkers: uint32(adv.MaxWorkers),
			FromNumWorkers: uint32(adv.FromNumWorkers), FromPrefetchFactor: uint32(adv.FromPrefetchFactor),
		}}})
		if ev.Delivered {
			// Only advice that reached the node's stream counts: it
			// becomes the advisor's baseline and starts its cooldown.
			s.adv.Commit(adv)
			s.epoch.adjustments++
			a.sent.Add(1)
		} else {
			ev.Reason += " — not delivered (node not connected or its advisory queue full): not counted; proposed again at the next evaluation"
		}
		a.log.Info("dataloader advice", "run_id", run, "node", node, "class", adv.Class,
			"num_workers", adv.NumWorkers, "prefetch_factor", adv.PrefetchFactor, "delivered", ev.Delivered)
	}
	if b, err := proto.Marshal(ev); err == nil {
		recs[evalKey(run, node, at)] = b
	}
}

func (a *Advisor) closeEpoch(run, node string, s *runState, epoch int64, steps float64, partial bool, at time.Time, ranW, ranP int, reported bool, recs map[string][]byte) {
	w, p := s.adv.Current()
	steps = max(0, steps)
	s.closedSteps += steps
	e := &trainmeterv1.DataloaderEpoch{
		Node: node, Epoch: epoch, Partial: partial, Adjustments: s.epoch.adjustments,
		NumWorkers: uint32(w), PrefetchFactor: uint32(p), Steps: uint64(math.Round(steps)),
		AvgGpuUtilization: -1, AvgRamUsage: -1,
		RanNumWorkers: uint32(ranW), RanPrefetchFactor: uint32(ranP), RanReported: reported, End: timestamppb.New(at),
		MeasuredTokens: s.epoch.measuredTokens, MeasuredS: s.epoch.measuredS, TokensPerS: -1,
	}
	if s.epoch.measuredS > 0 {
		e.TokensPerS = float64(s.epoch.measuredTokens) / s.epoch.measuredS
	}
	if s.epoch.utilN > 0 {
		e.AvgGpuUtilization = s.epoch.utilSum / float64(s.epoch.utilN) / 100
	}
	if s.epoch.ramN > 0 {
		e.AvgRamUsage = s.epoch.ramSum / float64(s.epoch.ramN)
	}
	if t := s.epoch.dataWait + s.epoch.compute; t > 0 {
		e.DataWaitShare = s.epoch.dataWait / t
	}
	s.epoch = epochAcc{}
	if b, err := proto.Marshal(e); err == nil {
		recs[epochKey(run, node, epoch, at)] = b
	}
}

// Keys: <run>\0e\0<node>\0<unix ns, 20 digits> for evaluations and
// <run>\0p\0<node>\0<epoch, 20 digits>\0<unix ns> for epochs, so a run's
// history is one prefix scan in time (epoch) order per node.
func evalKey(run, node string, at time.Time) string {
	return fmt.Sprintf("%s\x00e\x00%s\x00%020d", run, node, at.UnixNano())
}

func epochKey(run, node string, epoch int64, at time.Time) string {
	return fmt.Sprintf("%s\x00p\x00%s\x00%020d\x00%020d", run, node, epoch, at.UnixNano())
}

// History reads a run's stored evaluations and epochs.
func History(st storage.Store, run string) (*trainmeterv1.DataloaderHistoryResponse, error) {
	out := &trainmeterv1.DataloaderHistoryResponse{}
	err := st.ScanRecords(Namespace, run+"\x00", func(k string, v []byte) (bool, error) {
		return addRecord(out, k[len(run)+1:], v)
	})
	if err != nil {
		return nil, err
	}
	out.Changes = Changes(out)
	return out, nil
}

// Histories is History of every run that has one, by run id, read in one
// scan of the namespace (not a scan per run). A key's run id is what
// precedes its first NUL: a run whose id has a NUL in it is not keyed
// here by its id (read it with History).
func Histories(st storage.Store) (map[string]*trainmeterv1.DataloaderHistoryResponse, error) {
	out := map[string]*trainmeterv1.DataloaderHistoryResponse{}
	err := st.ScanRecords(Namespace, "", func(k string, v []byte) (bool, error) {
		run, rest, ok := strings.Cut(k, "\x00")
		if !ok {
			return true, nil
		}
		h := out[run]
		if h == nil {
			h = &trainmeterv1.DataloaderHistoryResponse{}
			out[run] = h
		}
		return addRecord(h, rest, v)
	})
	if err != nil {
		return nil, err
	}
	for _, h := range out {
		h.Changes = Changes(h)
	}
	return out, nil
}

// addRecord adds to h the record of key rest (its key after the run id
// and its NUL) and value v; any other record is passed over.
func addRecord(h *trainmeterv1.DataloaderHistoryResponse, rest string, v []byte) (bool, error) {
	var m proto.Message
	switch {
	case len(rest) > 2 && rest[:2] == "e\x00":
		e := &trainmeterv1.DataloaderEvaluation{}
		m, h.Evaluations = e, append(h.Evaluations, e)
	case len(rest) > 2 && rest[:2] == "p\x00":
		e := &trainmeterv1.DataloaderEpoch{}
		m, h.Epochs = e, append(h.Epochs, e)
	default:
		return true, nil
	}
	err := proto.Unmarshal(v, m)
	return err == nil, err
}

// DataloaderRecommendation turns a run's live advice history into a
// recommendation for its next run: start with the last advised settings
// (advice that reached the node; undelivered proposals are ignored).
// Where the collector measured the run's throughput before the first
// applied change and after the last one (h.Changes), the savings are the
// time that speedup saves, cost × (1 − before ÷ after), confidence 0.8;
// else they are the expected gain (data-wait share when the first change
// was advised) × the run's cost, confidence 0.6 (an upper bound: the
// loader may not make up the whole wait).
func DataloaderRecommendation(r *trainmeterv1.RunReport, h *trainmeterv1.DataloaderHistoryResponse) *trainmeterv1.Recommendation {
	var first, last *trainmeterv1.DataloaderEvaluation
	var reasons []string
	for _, e := range h.GetEvaluations() {
		if e.GetChanged() && e.GetDelivered() {
			first, last = cmp.Or(first, e), e
			reasons = append(reasons, fmt.Sprintf("step %d %s: workers %d prefetch %d", e.GetStep(), e.GetClassification(), e.GetNumWorkers(), e.GetPrefetchFactor()))
		}
	}
	if last == nil {
		return nil
	}
	gain := first.GetExpectedGain()
	risks := []string{"more workers and prefetch use more host RAM and CPU", "the expected gain is the data-wait share: an upper bound"}
	if last.GetClassification() == "memory-bound" {
		risks = []string{"less prefetch can expose data wait again", "the RAM may be used by something other than the loader"}
	}
	evidence := fmt.Sprintf("data wait %.0f%% of step time when first advised, expected gain %.0f%%; advice: %s",
		100*first.GetDataWaitShare(), 100*gain, strings.Join(reasons, "; "))
	share, confidence := gain, 0.6
	if before, after, ok := measuredSpeedup(h.GetChanges()); ok {
		speedup := after.GetTokensPerSAfter() / before.GetTokensPerSBefore()
		share, confidence = max(0, 1-1/speedup), 0.8
		evidence += fmt.Sprintf("; measured (after warmup, all GPUs): %.0f tok/s with num_workers %d, prefetch_factor %d before, %.0f tok/s with %d, %d after (×%.2f)",
			before.GetTokensPerSBefore(), before.GetFromNumWorkers(), before.GetFromPrefetchFactor(),
			after.GetTokensPerSAfter(), after.GetNumWorkers(), after.GetPrefetchFactor(), speedup)
		risks[len(risks)-1] = "the speedup was measured on one run: another host or dataset may differ"
		if speedup < 1 {
			risks[len(risks)-1] = "the change made this run slower: keep the old settings"
		}
	}
	var usd *float64 // absent when the run has no cost: not costed, not free
	if r.TotalCostUsd != nil {
		usd = proto.Float64(share * r.GetTotalCostUsd())
	}
	return &trainmeterv1.Recommendation{
		Kind:       "dataloader",
		Title:      fmt.Sprintf("Start %s with num_workers=%d, prefetch_factor=%d", r.GetRunId(), last.GetNumWorkers(), last.GetPrefetchFactor()),
		Action:     fmt.Sprintf("DataLoader(num_workers=%d, prefetch_factor=%d) from the first epoch (%s)", last.GetNumWorkers(), last.GetPrefetchFactor(), last.GetClassification()),
		SavingsUsd: usd, SavingsJ: share * r.GetEnergyTotalJ(), Confidence: confidence,
		Risks:    risks,
		RunIds:   []string{r.GetRunId()},
		Model:    r.GetMetadata().GetModel(),
		Evidence: evidence,
	}
}

// measuredSpeedup: the first applied change (its throughput before) and the
// last one (after), when both were measured and the trainer reported its
// settings (a change only assumed applied may never have happened: its
// "gain" would be noise).
func measuredSpeedup(cs []*trainmeterv1.DataloaderChange) (before, after *trainmeterv1.DataloaderChange, ok bool) {
	if len(cs) == 0 {
		return nil, nil, false
	}
	before, after = cs[0], cs[len(cs)-1]
	return before, after, before.GetReported() && after.GetReported() &&
		before.GetTokensPerSBefore() > 0 && after.GetTokensPerSAfter() > 0
}
