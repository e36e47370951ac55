package query

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/advice/dataloadersvc"
	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// DefaultTimelinePoints is the most points per series when a request gives
// none: enough for a chart as wide as a screen.
const DefaultTimelinePoints = 2000

// minTimelinePoints keeps min/max downsampling meaningful.
const minTimelinePoints = 10

// nodeSpan is where and on which GPUs a run ran on one node.
type nodeSpan struct {
	first, last time.Time
	gpus        map[uint32]bool
}

// bucket is one second of a run (or of one of its nodes).
type bucket struct {
	energy, dur, tokens, wait, compute, vram float64
	power                                    float64 // of all: the sum of its nodes' powers
}

type series struct {
	name, unit string
	t          []int64
	v          []float64
}

// Timeline implements QueryService.Timeline: the run's stored windows
// summed per second over its nodes, then downsampled (min and max per
// bucket) to at most max_points per series.
func (s *Server) Timeline(_ context.Context, req *trainmeterv1.TimelineRequest) (*trainmeterv1.TimelineResponse, error) {
	if req.GetRunId() == "" {
		return nil, status.Error(codes.InvalidArgument, "run_id is empty")
	}
	maxPts := cmp.Or(int(req.GetMaxPoints()), DefaultTimelinePoints)
	if maxPts < minTimelinePoints {
		return nil, status.Errorf(codes.InvalidArgument, "max_points %d: want at least %d", maxPts, minTimelinePoints)
	}
	agg, err := s.store.GetRun(req.GetRunId())
	if err != nil {
		return nil, s.runErr(req.GetRunId(), err)
	}
	ws, es, err := s.store.RunTimeline(req.GetRunId())
	if err != nil {
		return nil, s.storeErr(err)
	}
	from, to := timeOf(req.GetFrom()), timeOf(req.GetTo())
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		return nil, status.Errorf(codes.InvalidArgument, "time range: to %v is not after from %v", to, from)
	}
	outside := func(t time.Time) bool { return (!from.IsZero() && t.Before(from)) || (!to.IsZero() && !t.Before(to)) }
	resp := &trainmeterv1.TimelineResponse{RunId: req.GetRunId()}

	all := map[int64]*bucket{}
	nodes := map[string]map[int64]*bucket{}
	var first, last, warmupEnd time.Time
	spans := map[string]*nodeSpan{}
	for _, nw := range ws {
		w := nw.Window
		st, en := w.GetStart().AsTime(), w.GetEnd().AsTime()
		if first.IsZero() || st.Before(first) {
			first = st
		}
		if en.After(last) {
			last = en
		}
		if w.GetPhase() == trainmeterv1.Phase_PHASE_MEASURED && (warmupEnd.IsZero() || st.Before(warmupEnd)) {
			warmupEnd = st
		}
		if outside(st) {
			continue
		}
		sp := spans[nw.Node]
		if sp == nil {
			sp = &nodeSpan{first: st, last: st, gpus: map[uint32]bool{}}
			spans[nw.Node] = sp
		}
		if st.Before(sp.first) {
			sp.first = st
		}
		if st.After(sp.last) {
			sp.last = st
		}
		for _, g := range w.GetGpus() {
			sp.gpus[g] = true
		}
		e := w.GetEnergyIntegratedJ()
		if w.GetCounterOk() {
			e = w.GetEnergyCounterJ()
		}
		sec := st.Unix()
		add := func(m map[int64]*bucket) {
			b := m[sec]
			if b == nil {
				b = &bucket{}
				m[sec] = b
			}
			b.energy += e
			b.dur += en.Sub(st).Seconds()
			b.tokens += float64(w.GetTokens())
			b.wait += w.GetDataWaitS()
			b.compute += w.GetComputeS()
			b.vram = math.Max(b.vram, w.GetVramPeakMib())
		}
		add(all)
		if nodes[nw.Node] == nil {
			nodes[nw.Node] = map[int64]*bucket{}
		}
		add(nodes[nw.Node])
	}
	if !first.IsZero() {
		resp.Start, resp.End = timestamppb.New(first), timestamppb.New(last)
	}
	if !warmupEnd.IsZero() {
		resp.WarmupEnd = timestamppb.New(warmupEnd)
	}

	secs := slices.Sorted(maps.Keys(all))
	power := func(b *bucket) float64 {
		if b.dur <= 0 {
			return 0
		}
		return b.energy / b.dur
	}
	var out []*series
	mk := func(name, unit string, val func(b *bucket) (float64, bool), m map[int64]*bucket) *series {
		sr := &series{name: name, unit: unit}
		for _, k := range secs {
			if b := m[k]; b != nil {
				if v, ok := val(b); ok {
					sr.t = append(sr.t, k*1000)
					sr.v = append(sr.v, v)
				}
			}
		}
		return sr
	}
	// Total power is the sum of the nodes' powers: each node's energy over
	// the time it covered in that second (segments are cut at run start,
	// warmup end and run end).
	for _, m := range nodes {
		for k, b := range m {
			all[k].power += power(b)
		}
	}
	out = append(out, mk("power_w", "W (the run's GPUs, all nodes)", func(b *bucket) (float64, bool) { return b.power, true }, all))
	nodeNames := slices.Sorted(maps.Keys(nodes))
	// The per-GPU series read the node's GPU windows, the most expensive
	// part of a timeline: only when asked for (or everything is).
	perGPU := len(req.GetSeries()) == 0 || slices.ContainsFunc(req.GetSeries(), func(name string) bool {
		return strings.HasPrefix(name, "power_w:") && strings.Contains(name, "/gpu")
	})
	for _, n := range nodeNames {
		out = append(out, mk("power_w:"+n, "W (the run's GPUs on node "+n+")", func(b *bucket) (float64, bool) { return power(b), true }, nodes[n]))
		if !perGPU {
			continue
		}
		gpuSeries, err := gpuPower(s.store, n, spans[n])
		if err != nil {
			return nil, s.storeErr(err)
		}
		out = append(out, gpuSeries...)
	}
	var acc float64
	out = append(out, mk("energy_j", "J, cumulative from the range's start, warmup included, all GPUs", func(b *bucket) (float64, bool) {
		acc += b.energy
		return acc, true
	}, all),
		mk("tok_per_s", "tokens/s (all ranks; each point one second)", func(b *bucket) (float64, bool) { return b.tokens, true }, all),
		mk("j_per_token", "J/token (per second, all GPUs)", func(b *bucket) (float64, bool) { return b.energy / b.tokens, b.tokens > 0 }, all),
		mk("vram_peak_mib", "MiB (highest per-GPU memory used)", func(b *bucket) (float64, bool) { return b.vram, true }, all),
		mk("data_wait_s", "rank-seconds per second waiting for data", func(b *bucket) (float64, bool) { return b.wait, true }, all),
		mk("compute_s", "rank-seconds per second computing", func(b *bucket) (float64, bool) { return b.compute, true }, all),
	)
	asked, want := len(req.GetSeries()) > 0, map[string]bool{}
	for _, n := range req.GetSeries() {
		want[n] = true
	}
	for _, sr := range out {
		if asked && !want[sr.name] {
			continue
		}
		delete(want, sr.name)
		t, v := downsample(sr.t, sr.v, maxPts)
		resp.Series = append(resp.Series, &trainmeterv1.TimelineSeries{Name: sr.name, Unit: sr.unit, TUnixMs: t, Values: v, SourcePoints: uint32(len(sr.t))})
	}
	if len(want) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "unknown series %s", strings.Join(slices.Sorted(maps.Keys(want)), ", "))
	}
	if asked { // in the order asked for
		slices.SortStableFunc(resp.Series, func(a, b *trainmeterv1.TimelineSeries) int {
			return slices.Index(req.GetSeries(), a.GetName()) - slices.Index(req.GetSeries(), b.GetName())
		})
	}

	var events []*trainmeterv1.TimelineEvent
	for _, ne := range es {
		te := &trainmeterv1.TimelineEvent{Node: ne.Node}
		switch ev := ne.Event.GetEvent().(type) {
		case *trainmeterv1.RunEvent_RunStart:
			te.Kind, te.Time, te.Text = "run_start", ev.RunStart.GetTime(), "run starts"
		case *trainmeterv1.RunEvent_RunEnd:
			te.Kind, te.Time, te.Text = "run_end", ev.RunEnd.GetTime(), "run ends"
		case *trainmeterv1.RunEvent_Eval:
			e := ev.Eval
			te.Kind, te.Time = "eval", e.GetTime()
			te.Text = fmt.Sprintf("eval epoch %d", e.GetEpoch())
			if e.ValLoss != nil {
				te.Text += fmt.Sprintf(" val_loss %.4g", e.GetValLoss())
			}
			if e.Accuracy != nil {
				te.Text += fmt.Sprintf(" accuracy %.4g", e.GetAccuracy())
			}
		default:
			continue
		}
		events = append(events, te)
	}
	// After the run's own events: a run without warmup starts, then measures.
	if resp.WarmupEnd != nil {
		events = append(events, &trainmeterv1.TimelineEvent{Time: resp.WarmupEnd, Kind: "warmup_end", Text: "measured phase starts"})
	}
	recorded, err := s.recordedEvents(req.GetRunId(), agg.GetRunStart().GetGpuName(), first, last)
	if err != nil {
		return nil, s.storeErr(err)
	}
	for _, te := range append(events, recorded...) {
		if !outside(te.GetTime().AsTime()) {
			resp.Events = append(resp.Events, te)
		}
	}
	slices.SortStableFunc(resp.Events, func(a, b *trainmeterv1.TimelineEvent) int { return a.GetTime().AsTime().Compare(b.GetTime().AsTime()) })
	return resp, nil
}

// downsample keeps at most max points: the series is cut into max/2
// buckets of equal point count and each keeps its lowest and highest point,
// in time order, so that spikes and dips survive (a chart drawn from it
// looks like one drawn from every point).
func downsample(t []int64, v []float64, maxPts int) ([]int64, []float64) {
	if len(t) <= maxPts {
		return t, v
	}
	nb := maxPts / 2
	ot, ov := make([]int64, 0, maxPts), make([]float64, 0, maxPts)
	for b := range nb {
		lo, hi := b*len(t)/nb, (b+1)*len(t)/nb
		mi, ma := lo, lo
		for i := lo; i < hi; i++ {
			if v[i] < v[mi] {
				mi = i
			}
			if v[i] > v[ma] {
				ma = i
			}
		}
		first, second := min(mi, ma), max(mi, ma)
		ot, ov = append(ot, t[first]), append(ov, v[first])
		if second != first {
			ot, ov = append(ot, t[second]), append(ov, v[second])
		}
	}
	return ot, ov
}

// gpuPower is the power of each of the run's GPUs on a node, from the
// node's GPU windows (one a second, whole GPU: a GPU shared by two runs
// shows both runs' draw).
func gpuPower(ts storage.Windows, node string, sp *nodeSpan) ([]*series, error) {
	if sp == nil || len(sp.gpus) == 0 {
		return nil, nil
	}
	// Batch windows start on whole seconds or earlier than the run's first
	// segment, which may start mid-window.
	bs, err := ts.NodeGPUWindows(node, sp.first.Truncate(time.Second).Add(-time.Second), sp.last)
	if err != nil {
		return nil, err
	}
	idx := slices.Sorted(maps.Keys(sp.gpus))
	out := make([]*series, len(idx))
	for i, g := range idx {
		out[i] = &series{name: fmt.Sprintf("power_w:%s/gpu%d", node, g), unit: fmt.Sprintf("W (GPU %d of node %s, mean over each window)", g, node)}
	}
	for _, b := range bs {
		ws, we := b.GetWindowStart().AsTime(), b.GetWindowEnd().AsTime()
		if !we.After(sp.first) || ws.After(sp.last) {
			continue
		}
		for _, gw := range b.GetGpuWindows() {
			if i, ok := slices.BinarySearch(idx, gw.GetGpu()); ok {
				out[i].t = append(out[i].t, ws.UnixMilli())
				out[i].v = append(out[i].v, gw.GetPowerAvgW())
			}
		}
	}
	return out, nil
}

// recordedEvents are what the collector itself decided about the run, kept
// in its records: dataloader advice (changes the advisor proposed, and
// whether they reached the node), budget alerts naming the run, and price
// alerts on the run's GPU model while it ran.
func (s *Server) recordedEvents(run, gpuName string, first, last time.Time) ([]*trainmeterv1.TimelineEvent, error) {
	var out []*trainmeterv1.TimelineEvent
	h, err := dataloadersvc.History(s.store, run)
	if err != nil {
		return nil, err
	}
	for _, e := range h.GetEvaluations() {
		if !e.GetChanged() {
			continue
		}
		state := "sent"
		if !e.GetDelivered() {
			state = "not delivered"
		}
		out = append(out, &trainmeterv1.TimelineEvent{Time: e.GetTime(), Kind: "advice", Node: e.GetNode(),
			Text: fmt.Sprintf("dataloader advice %s: num_workers %d, prefetch_factor %d (%s)", state, e.GetNumWorkers(), e.GetPrefetchFactor(), e.GetReason())})
	}
	alerts, err := (&alert.Recorder{Store: s.store}).List("")
	if err != nil {
		return nil, err
	}
	for _, a := range alerts {
		switch {
		case a.Kind == alert.KindBudget && slices.Contains(a.RunIDs, run):
			out = append(out, &trainmeterv1.TimelineEvent{Time: timestamppb.New(a.Time), Kind: "budget_alert", Text: a.Message})
		case a.Kind == alert.KindPrice && gpuName != "" && a.GPUName == gpuName && !first.IsZero() && !a.Time.Before(first) && !a.Time.After(last):
			out = append(out, &trainmeterv1.TimelineEvent{Time: timestamppb.New(a.Time), Kind: "price_alert", Text: a.Message})
		}
	}
	return out, nil
}
