// Package compare compares training runs: it groups runs (picked, or a
// model's runs by a metadata key), summarises each group's figures as a
// mean with a 95 % confidence interval over its repeated runs, and states
// each group's relative difference from a baseline group with its interval
// and Welch's t-test p-value. The collector's Compare RPC serves it to the
// CLI and the console alike (docs/console.md).
package compare

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// NoValue is the group key of runs that lack the grouping key's value.
const NoValue = "(none)"

// Keys are the metadata keys runs can be grouped by, besides label:KEY.
var Keys = []string{"backend", "batch_size", "precision", "gpu_name", "dataset", "optimizer", "seq_len", "grad_accum", "nodes", "gpus"}

// ErrInvalid marks a request that cannot be answered as asked.
var ErrInvalid = errors.New("invalid compare request")

func invalid(f string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(f, a...))
}

// keyValues read a run's value of each of Keys; m is never nil.
var keyValues = map[string]func(r *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string{
	"backend":    func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return orNone(m.GetBackend()) },
	"precision":  func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return orNone(m.GetPrecision()) },
	"dataset":    func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return orNone(m.GetDataset()) },
	"optimizer":  func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return orNone(m.GetOptimizer()) },
	"gpu_name":   func(r *trainmeterv1.RunReport, _ *trainmeterv1.RunMetadata) string { return orNone(r.GetGpuName()) },
	"batch_size": func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return optInt(m.BatchSize) },
	"seq_len":    func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return optInt(m.SeqLen) },
	"grad_accum": func(_ *trainmeterv1.RunReport, m *trainmeterv1.RunMetadata) string { return optInt(m.GradAccum) },
	"nodes":      func(r *trainmeterv1.RunReport, _ *trainmeterv1.RunMetadata) string { return fmt.Sprint(r.GetNodes()) },
	"gpus":       func(r *trainmeterv1.RunReport, _ *trainmeterv1.RunMetadata) string { return fmt.Sprint(r.GetGpus()) },
}

// KeyOf returns run r's value of the grouping key by (see Keys; label:KEY
// reads a label), and whether by is a known key.
func KeyOf(r *trainmeterv1.RunReport, by string) (string, bool) {
	if k, ok := strings.CutPrefix(by, "label:"); ok {
		if k == "" {
			return "", false
		}
		v, has := r.GetLabels()[k]
		if !has {
			return NoValue, true
		}
		return v, true
	}
	if value, ok := keyValues[by]; ok {
		return value(r, cmp.Or(r.GetMetadata(), &trainmeterv1.RunMetadata{})), true
	}
	return "", false
}

// optInt is *v in decimal, or NoValue when v is not given.
func optInt(v *int64) string {
	if v == nil {
		return NoValue
	}
	return strconv.FormatInt(*v, 10)
}

// Select picks the runs req asks for out of all: the named runs in the
// order named (every one must exist), or the ended runs of req's model.
func Select(req *trainmeterv1.CompareRequest, all []*trainmeterv1.RunReport) ([]*trainmeterv1.RunReport, error) {
	if len(req.GetRunIds()) > 0 {
		if req.GetModel() != "" {
			return nil, invalid("give runs or a model, not both")
		}
		byID := make(map[string]*trainmeterv1.RunReport, len(all))
		for _, r := range all {
			byID[r.GetRunId()] = r
		}
		var out []*trainmeterv1.RunReport
		var missing []string
		seen := map[string]bool{}
		for _, id := range req.GetRunIds() {
			if seen[id] {
				return nil, invalid("run %q named twice", id)
			}
			seen[id] = true
			if r := byID[id]; r != nil {
				out = append(out, r)
			} else {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return nil, invalid("unknown run(s): %q", missing)
		}
		return out, nil
	}
	if req.GetModel() == "" {
		return nil, invalid("give at least two runs, or a model (and a key to group by)")
	}
	var out []*trainmeterv1.RunReport
	for _, r := range all {
		if r.GetMetadata().GetModel() == req.GetModel() && r.GetEnded() {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, invalid("model %q has no ended runs", req.GetModel())
	}
	return out, nil
}

type group struct {
	key  string
	runs []*trainmeterv1.RunReport
}

// Compare groups runs as req asks and compares the groups with the
// baseline. Without req.By each run is a group of its own, in the order
// given; with it, groups are ordered by key (numerically where every key is
// a number).
func Compare(req *trainmeterv1.CompareRequest, runs []*trainmeterv1.RunReport) (*trainmeterv1.CompareResponse, error) {
	groups, err := groupRuns(req.GetBy(), runs)
	if err != nil {
		return nil, err
	}
	if len(groups) < 2 {
		if req.GetBy() == "" || len(groups) == 0 {
			return nil, invalid("nothing to compare: give at least two runs, or a key to group by")
		}
		return nil, invalid("all %d run(s) have %s = %s: nothing to compare", len(runs), req.GetBy(), groups[0].key)
	}
	base := 0
	if b := req.GetBaseline(); b != "" {
		base = slices.IndexFunc(groups, func(g group) bool { return g.key == b })
		if base < 0 {
			keys := make([]string, len(groups))
			for i, g := range groups {
				keys[i] = g.key
			}
			return nil, invalid("no group %q to use as the baseline; the groups are %s", b, strings.Join(keys, ", "))
		}
	}
	resp := &trainmeterv1.CompareResponse{By: req.GetBy(), Baseline: groups[base].key}
	figs := make([]figures, len(groups))
	for i, g := range groups {
		figs[i] = summarize(g.runs)
		resp.Groups = append(resp.Groups, figs[i].proto(g))
		if len(g.runs) == 1 {
			resp.Warnings = append(resp.Warnings, fmt.Sprintf("group %s has one run: no confidence interval or p-value", g.key))
		}
		for _, r := range g.runs {
			if !r.GetEnded() {
				resp.Warnings = append(resp.Warnings, fmt.Sprintf("run %s has not ended: its figures still move", r.GetRunId()))
			}
		}
	}
	resp.Warnings = append(resp.Warnings, fairness(resp.GetGroups())...)
	for i, g := range groups {
		if i == base {
			continue
		}
		a, b := figs[i], figs[base]
		resp.Rows = append(resp.Rows, &trainmeterv1.CompareRow{
			Key:             g.key,
			JPerTokenRatio:  ratio(a.jpt, b.jpt, false),
			Speedup:         ratio(a.tps, b.tps, false),
			EnergySavingPct: ratio(a.jpt, b.jpt, true),
			VramSavingPct:   ratio(a.vram, b.vram, true),
			CostSavingPct:   ratio(a.usd, b.usd, true),
		})
	}
	return resp, nil
}

func groupRuns(by string, runs []*trainmeterv1.RunReport) ([]group, error) {
	if by == "" {
		out := make([]group, len(runs))
		for i, r := range runs {
			out[i] = group{key: r.GetRunId(), runs: []*trainmeterv1.RunReport{r}}
		}
		return out, nil
	}
	if _, ok := KeyOf(&trainmeterv1.RunReport{}, by); !ok {
		return nil, invalid("cannot group by %q: use one of %s, or label:KEY", by, strings.Join(Keys, ", "))
	}
	idx := map[string]int{}
	var out []group
	for _, r := range runs {
		k, _ := KeyOf(r, by)
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, group{key: k})
		}
		out[i].runs = append(out[i].runs, r)
	}
	numeric := !slices.ContainsFunc(out, func(g group) bool {
		_, err := strconv.ParseFloat(g.key, 64)
		return err != nil
	})
	slices.SortFunc(out, func(a, b group) int {
		if numeric {
			x, _ := strconv.ParseFloat(a.key, 64)
			y, _ := strconv.ParseFloat(b.key, 64)
			return cmp.Compare(x, y)
		}
		return strings.Compare(a.key, b.key)
	})
	return out, nil
}

// figures are a group's summaries. A run contributes to a figure only when
// it has it: J/token and E10k_J need measured tokens, $/Mtok a price.
type figures struct{ jpt, tps, e10k, vram, usd Summary }

func summarize(runs []*trainmeterv1.RunReport) figures {
	var jpt, tps, e10k, vram, usd []float64
	for _, r := range runs {
		if r.GetJPerToken() > 0 {
			jpt = append(jpt, r.GetJPerToken())
			e10k = append(e10k, r.GetJPerToken()*1e4)
		}
		if r.GetTokPerS() > 0 {
			tps = append(tps, r.GetTokPerS())
		}
		if r.GetVramPeakMb() > 0 {
			vram = append(vram, r.GetVramPeakMb())
		}
		if r.GetUsdPerMtok() > 0 {
			usd = append(usd, r.GetUsdPerMtok())
		}
	}
	return figures{Summarize(jpt), Summarize(tps), Summarize(e10k), Summarize(vram), Summarize(usd)}
}

func stat(s Summary) *trainmeterv1.CompareStat {
	st := &trainmeterv1.CompareStat{Mean: s.Mean, Stddev: s.SD, N: uint32(s.N)}
	if s.HasInterval {
		st.CiLow, st.CiHigh = &s.Low, &s.High
	}
	return st
}

func (f figures) proto(g group) *trainmeterv1.CompareGroup {
	out := &trainmeterv1.CompareGroup{Key: g.key, JPerToken: stat(f.jpt), TokPerS: stat(f.tps), E10KJ: stat(f.e10k), VramPeakMb: stat(f.vram), UsdPerMtok: stat(f.usd)}
	for _, r := range g.runs {
		out.RunIds = append(out.RunIds, r.GetRunId())
		out.GpuNames = append(out.GpuNames, r.GetGpuName())
		out.NodeCounts = append(out.NodeCounts, r.GetNodes())
		out.Datasets = append(out.Datasets, r.GetMetadata().GetDataset())
		out.SeqLens = append(out.SeqLens, r.GetMetadata().GetSeqLen()) // 0: not given
		out.Points = append(out.Points, &trainmeterv1.CompareRunPoint{RunId: r.GetRunId(), TokPerS: r.TokPerS, JPerToken: r.JPerToken})
	}
	out.GpuNames = distinct(out.GpuNames)
	out.NodeCounts = distinct(out.NodeCounts)
	out.SeqLens = distinct(out.SeqLens)
	out.Datasets = distinct(out.Datasets)
	return out
}

// distinct sorts xs and drops its repeats.
func distinct[T cmp.Ordered](xs []T) []T {
	slices.Sort(xs)
	return slices.Compact(xs)
}

// ratio is mean(a)/mean(b) with its interval and the p-value of a against
// b; as a saving, (1 − ratio) × 100 (the interval's ends swap).
func ratio(a, b Summary, saving bool) *trainmeterv1.CompareDiff {
	if a.N == 0 || b.N == 0 || b.Mean == 0 {
		return nil
	}
	d := &trainmeterv1.CompareDiff{Value: a.Mean / b.Mean}
	if lo, hi, ok := RatioInterval(a, b); ok {
		if saving {
			lo, hi = (1-hi)*100, (1-lo)*100
		}
		d.CiLow, d.CiHigh = &lo, &hi
	}
	if p, ok := Welch(a, b); ok {
		d.PValue = &p
	}
	if saving {
		d.Value = (1 - d.Value) * 100
	}
	return d
}

// fairness says in words where groups differ in what makes their figures
// incomparable: GPU model, node count, sequence length, dataset.
func fairness(groups []*trainmeterv1.CompareGroup) []string {
	var out []string
	check := func(what string, vals func(*trainmeterv1.CompareGroup) []string) {
		all := map[string]bool{}
		for _, g := range groups {
			for _, v := range vals(g) {
				all[v] = true
			}
		}
		if len(all) < 2 {
			return
		}
		var parts []string
		for _, g := range groups {
			parts = append(parts, fmt.Sprintf("%s: %s", g.GetKey(), strings.Join(vals(g), "/")))
		}
		out = append(out, fmt.Sprintf("unfair comparison: the runs differ in %s (%s)", what, strings.Join(parts, "; ")))
	}
	check("GPU model", func(g *trainmeterv1.CompareGroup) []string { return words(g.GetGpuNames(), orNone) })
	check("node count", func(g *trainmeterv1.CompareGroup) []string {
		return words(g.GetNodeCounts(), func(v uint32) string { return strconv.FormatUint(uint64(v), 10) })
	})
	check("sequence length", func(g *trainmeterv1.CompareGroup) []string {
		return words(g.GetSeqLens(), func(v int64) string {
			if v == 0 {
				return NoValue // not given
			}
			return strconv.FormatInt(v, 10)
		})
	})
	check("dataset", func(g *trainmeterv1.CompareGroup) []string { return words(g.GetDatasets(), orNone) })
	return out
}

func words[T any](vs []T, word func(T) string) []string {
	var s []string
	for _, v := range vs {
		s = append(s, word(v))
	}
	return s
}

// orNone is s, or NoValue for "".
func orNone(s string) string { return cmp.Or(s, NoValue) }
