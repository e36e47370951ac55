// Package storagetest is the conformance suite every storage.Store passes:
// run it from the implementation's tests with a func that opens an empty
// store.
package storagetest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/clock"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Reopener is a store that can be closed and opened again on its data (a
// collector restart). Reopen returns the store opened again; the Reopen
// subtest runs only for stores that are Reopeners.
type Reopener interface {
	storage.Store
	Reopen(t *testing.T) storage.Store
}

// Options are what a subtest opens its store with; a store must honour
// them (the limits are a security guarantee, so no store may leave them
// out).
type Options struct {
	// Limits bounds the runs a node may start (docs/security.md).
	Limits fold.Limits
	// Clock is the store's clock; nil: the wall clock.
	Clock clock.Clock
}

// Run runs the suite. open returns an empty store opened with o for one
// subtest and closes it when the subtest ends (t.Cleanup); a Reopener
// opens it again with the same o.
func Run(t *testing.T, open func(t *testing.T, o Options) storage.Store) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, storage.Store)
	}{
		{"ApplyOnce", applyOnce},
		{"ConcurrentDuplicates", concurrentDuplicates},
		{"RunOnTwoNodes", runOnTwoNodes},
		{"UsageAndDelete", usageAndDelete},
		{"UsagePeriods", usagePeriods},
		{"DeleteLiveRun", deleteLiveRun},
		{"Pages", pages},
		{"SelectRuns", selectRuns},
		{"Records", records},
		{"Reprice", reprice},
		{"Reopen", reopen},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, open(t, Options{})) })
	}
	for _, c := range []struct {
		name string
		fn   func(*testing.T, func(Options) storage.Store)
	}{
		{"LiveRunsLimit", liveRunsLimit},
		{"LiveRunsLimitConcurrent", liveRunsLimitConcurrent},
		{"NewRunsLimit", newRunsLimit},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, func(o Options) storage.Store { return open(t, o) }) })
	}
}

func apply(t *testing.T, st storage.Store, node, boot string, b *trainmeterv1.Batch) storage.Applied {
	t.Helper()
	a, err := st.ApplyBatchResult(storage.Sender{Node: node, Boot: boot}, b)
	if err != nil {
		t.Fatalf("apply %s/%s/%d: %v", node, boot, b.GetSeq(), err)
	}
	return a
}

// runBatch is batch seq of run over [sec, sec+1) on GPU 0: a window of
// tokens and energy J (the GPU drew 100 J, the rest idle), with events.
func runBatch(seq uint64, run string, sec float64, tokens uint64, energy float64, events ...*trainmeterv1.RunEvent) *trainmeterv1.Batch {
	return tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window(run, sec, tokens, energy)}, events...)
}

func report(t *testing.T, st storage.Store, run string) *trainmeterv1.RunReport {
	t.Helper()
	s, err := st.GetRun(run)
	if err != nil {
		t.Fatalf("run %q: %v", run, err)
	}
	return s.Report(aggregate.Pricing{})
}

// wantRun checks a run's tokens, nodes and stored windows and events.
func wantRun(t *testing.T, st storage.Store, run string, tokens uint64, nodes, windows, events int) {
	t.Helper()
	r := report(t, st, run)
	if r.GetTokensProcessed() != tokens || int(r.GetNodes()) != nodes {
		t.Errorf("run %q: tokens %d nodes %d, want %d and %d", run, r.GetTokensProcessed(), r.GetNodes(), tokens, nodes)
	}
	ws, es, err := st.RunTimeline(run)
	if err != nil || len(ws) != windows || len(es) != events {
		t.Errorf("run %q timeline: %d windows %d events (%v), want %d and %d", run, len(ws), len(es), err, windows, events)
	}
}

// usage sums a UsageScan over [since, until): GPU energy per node, run
// window energy per run, and deleted runs' window energy per node.
type usage struct {
	node, run, deleted map[string]float64
	gpuRecords         int
}

func scan(t *testing.T, st storage.Store, since, until time.Time) usage {
	t.Helper()
	u := usage{node: map[string]float64{}, run: map[string]float64{}, deleted: map[string]float64{}}
	err := st.UsageScan(since, until, func(node string, b *trainmeterv1.Batch) error {
		if len(b.GetGpuWindows()) > 0 {
			u.gpuRecords++
		}
		for _, g := range b.GetGpuWindows() {
			u.node[node] += g.GetEnergyCounterJ()
		}
		return nil
	}, func(run, _ string, w *trainmeterv1.RunWindow) error {
		u.run[run] += w.GetEnergyCounterJ()
		return nil
	}, func(node string, d *storev1.DeletedRunWindow) error {
		u.deleted[node] += d.GetWindow().GetEnergyCounterJ()
		return nil
	})
	if err != nil {
		t.Fatalf("usage scan: %v", err)
	}
	return u
}

// applyOnce: a batch is applied once per (node, boot, seq); the same seq
// from another boot is another batch.
func applyOnce(t *testing.T, st storage.Store) {
	if err := st.PutHello(&trainmeterv1.Hello{Node: "n1", BootId: "boot1", Gpus: []*trainmeterv1.GpuInfo{{Index: 0, Name: "Sim GPU"}}}); err != nil {
		t.Fatal(err)
	}
	b := runBatch(1, "r", 0, 100, 50, tu.Start("r", 0, "m"))
	if a := apply(t, st, "n1", "boot1", b); a.Duplicate {
		t.Fatal("first apply reported duplicate")
	}
	for i := range 2 {
		if a := apply(t, st, "n1", "boot1", runBatch(1, "r", 0, 100, 50, tu.Start("r", 0, "m"))); !a.Duplicate {
			t.Fatalf("resend %d of the same (node, boot, seq) not reported duplicate", i+1)
		}
	}
	if a := apply(t, st, "n1", "boot2", runBatch(1, "r", 1, 100, 50)); a.Duplicate {
		t.Fatal("seq 1 of another boot reported duplicate")
	}
	wantRun(t, st, "r", 200, 1, 2, 1)
	if u := scan(t, st, time.Time{}, time.Time{}); u.gpuRecords != 2 || u.node["n1"] != 200 || u.run["r"] != 100 {
		t.Errorf("usage: %d GPU records, node %v J, run %v J; want 2, 200 and 100", u.gpuRecords, u.node["n1"], u.run["r"])
	}
	gw, err := st.NodeGPUWindows("n1", tu.T0.Add(-time.Hour), tu.T0.Add(time.Hour))
	if err != nil || len(gw) != 2 {
		t.Errorf("GPU windows of n1: %d (%v), want 2", len(gw), err)
	}
	ns, err := st.Nodes()
	if err != nil || len(ns) != 1 || ns[0].GetNode() != "n1" || len(ns[0].GetGpus()) != 1 || ns[0].GetGpus()[0].GetName() != "Sim GPU" {
		t.Errorf("nodes: %v (%v), want n1 with its hello's GPU", ns, err)
	}
}

// concurrentDuplicates: one batch sent at once by several streams (an
// agent reconnecting to another collector) is applied exactly once.
func concurrentDuplicates(t *testing.T, st storage.Store) {
	const senders = 8
	var wg sync.WaitGroup
	applied := make(chan bool, senders)
	for range senders {
		wg.Go(func() {
			a, err := st.ApplyBatchResult(storage.Sender{Node: "n1", Boot: "b"}, runBatch(1, "r", 0, 100, 50, tu.Start("r", 0, "m")))
			if err != nil {
				t.Error(err)
			}
			applied <- err == nil && !a.Duplicate
		})
	}
	wg.Wait()
	close(applied)
	n := 0
	for ok := range applied {
		if ok {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d of %d concurrent sends applied, want 1", n, senders)
	}
	wantRun(t, st, "r", 100, 1, 1, 1)
}

// runOnTwoNodes: one run's windows from two nodes add up in its
// aggregate, and each stays with its node.
func runOnTwoNodes(t *testing.T, st storage.Store) {
	for _, node := range []string{"n1", "n2"} {
		apply(t, st, node, "b", runBatch(1, "shared", 0, 10, 5, tu.Start("shared", 0, "m")))
		apply(t, st, node, "b", runBatch(2, "shared", 1, 20, 5))
	}
	wantRun(t, st, "shared", 60, 2, 4, 2)
	if r := report(t, st, "shared"); r.GetGpus() != 2 {
		t.Errorf("gpus %d, want 2 (GPU 0 of each node)", r.GetGpus())
	}
	ws, _, err := st.RunTimeline("shared")
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]uint64{}
	for _, w := range ws {
		per[w.Node] += w.Window.GetTokens()
	}
	if per["n1"] != 30 || per["n2"] != 30 {
		t.Errorf("tokens per node %v, want 30 each", per)
	}
	u := scan(t, st, time.Time{}, time.Time{})
	if u.node["n1"] != 200 || u.node["n2"] != 200 || u.run["shared"] != 20 {
		t.Errorf("usage: nodes %v, run %v J; want 200 J a node and 20 J", u.node, u.run["shared"])
	}
}

// usageAndDelete: usage scans by window start; a deleted run leaves
// queries but not usage (its windows become the deleted run's), so runs +
// deleted + idle still add up to the node.
func usageAndDelete(t *testing.T, st storage.Store) {
	apply(t, st, "n1", "b", runBatch(1, "gone", 0, 10, 60, tu.Start("gone", 0, "m")))
	apply(t, st, "n1", "b", runBatch(2, "gone", 1, 10, 60, tu.End("gone", 2)))
	apply(t, st, "n1", "b", runBatch(3, "kept", 2, 10, 30, tu.Start("kept", 2, "m")))
	before := scan(t, st, time.Time{}, time.Time{})
	if before.node["n1"] != 300 || before.run["gone"] != 120 || before.run["kept"] != 30 || before.deleted["n1"] != 0 {
		t.Fatalf("usage before delete: %+v", before)
	}
	if u := scan(t, st, tu.T0.Add(time.Second), tu.T0.Add(2*time.Second)); u.node["n1"] != 100 || u.run["gone"] != 60 || u.run["kept"] != 0 {
		t.Errorf("usage of [1 s, 2 s): %+v, want one second's windows", u)
	}
	n, err := st.DeleteRun("gone")
	if err != nil || n == 0 {
		t.Fatalf("delete: %d records, %v", n, err)
	}
	if _, err := st.GetRun("gone"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("deleted run: %v, want ErrNotFound", err)
	}
	if ws, es, err := st.RunTimeline("gone"); err != nil || len(ws)+len(es) != 0 {
		t.Errorf("deleted run's timeline: %d windows %d events (%v)", len(ws), len(es), err)
	}
	if runs, err := st.ListRuns(nil); err != nil || len(runs) != 1 || runs[0].RunId != "kept" {
		t.Errorf("runs after delete: %v (%v), want only kept", runs, err)
	}
	after := scan(t, st, time.Time{}, time.Time{})
	if after.node["n1"] != 300 || after.run["gone"] != 0 || after.run["kept"] != 30 || after.deleted["n1"] != 120 {
		t.Errorf("usage after delete: %+v, want the node's 300 J with gone's 120 J deleted", after)
	}
	if _, err := st.DeleteRun("gone"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
}

// usagePeriods: a usage scan holds exactly the records whose windows
// start in the period, whatever the period, for nodes and runs with many
// windows each (a store may skip a node's or a run's records outside the
// period without reading them).
func usagePeriods(t *testing.T, st storage.Store) {
	const secs = 30
	for sec := range secs {
		seq, at := uint64(sec+1), float64(sec)
		var ev []*trainmeterv1.RunEvent
		if sec == 0 {
			ev = []*trainmeterv1.RunEvent{tu.Start("a", 0, "m"), tu.Start("c", 0, "m")}
		}
		apply(t, st, "n1", "b", tu.Batch(seq, at, []*trainmeterv1.RunWindow{tu.Window("a", at, 1, 10), tu.Window("c", at, 1, 20)}, ev...))
		ev = nil
		if sec == 0 {
			ev = []*trainmeterv1.RunEvent{tu.Start("b", 0, "m"), tu.Start("gone", 0, "m")}
		}
		apply(t, st, "n2", "b", tu.Batch(seq, at, []*trainmeterv1.RunWindow{tu.Window("b", at, 1, 30), tu.Window("gone", at, 1, 40)}, ev...))
	}
	apply(t, st, "n2", "b", runBatch(secs+1, "gone", secs, 1, 40, tu.End("gone", secs+1)))
	if _, err := st.DeleteRun("gone"); err != nil {
		t.Fatal(err)
	}
	at := func(sec int) time.Time { return tu.T0.Add(time.Duration(sec) * time.Second) }
	for _, p := range []struct{ since, until, from, to int }{ // [from, to): the seconds in the period
		{0, secs, 0, secs}, {5, 12, 5, 12}, {0, 1, 0, 1}, {secs - 1, secs, secs - 1, secs}, {10, 25, 10, 25},
		{-10, 3, 0, 3}, {25, 100, 25, secs + 1}, {secs + 5, secs + 9, 0, 0}, {-9, -1, 0, 0},
	} {
		u := scan(t, st, at(p.since), at(p.until))
		n := float64(p.to - p.from)
		inGone := n
		if p.to > secs { // gone's last window, at secs on n2 alone
			n--
		}
		want := usage{node: map[string]float64{"n1": 100 * n, "n2": 100 * inGone}, run: map[string]float64{"a": 10 * n, "c": 20 * n, "b": 30 * n},
			deleted: map[string]float64{"n2": 40 * inGone}}
		for _, m := range []map[string]float64{u.node, u.run, u.deleted, want.node, want.run, want.deleted} {
			maps.DeleteFunc(m, func(_ string, v float64) bool { return v == 0 })
		}
		if !maps.Equal(u.node, want.node) || !maps.Equal(u.run, want.run) || !maps.Equal(u.deleted, want.deleted) {
			t.Errorf("usage of [%d s, %d s): nodes %v runs %v deleted %v; want %v %v %v", p.since, p.until, u.node, u.run, u.deleted, want.node, want.run, want.deleted)
		}
	}
	if u := scan(t, st, time.Time{}, at(7)); u.run["a"] != 70 || u.node["n1"] != 700 {
		t.Errorf("usage until 7 s: %+v, want 7 s of a", u)
	}
	if u := scan(t, st, at(7), time.Time{}); u.run["a"] != 10*(secs-7) || u.deleted["n2"] != 40*(secs-6) {
		t.Errorf("usage since 7 s: %+v, want 23 s of a and 24 of gone", u)
	}
}

// deleteLiveRun: a run deleted while live stays deleted when its node
// sends more of it; the later windows count as the deleted run's.
func deleteLiveRun(t *testing.T, st storage.Store) {
	apply(t, st, "n1", "b", runBatch(1, "live", 0, 10, 60, tu.Start("live", 0, "m")))
	if _, err := st.DeleteLiveRun("live"); err != nil {
		t.Fatal(err)
	}
	if a := apply(t, st, "n1", "b", runBatch(2, "live", 1, 10, 60)); a.Duplicate {
		t.Fatal("next batch reported duplicate")
	}
	if _, err := st.GetRun("live"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("run after its next batch: %v, want ErrNotFound", err)
	}
	if u := scan(t, st, time.Time{}, time.Time{}); u.node["n1"] != 200 || u.run["live"] != 0 || u.deleted["n1"] != 120 {
		t.Errorf("usage: %+v, want 200 J on the node, 120 J deleted", u)
	}
}

// pages: runs list by id; a page starts after a cursor id, run or not.
func pages(t *testing.T, st storage.Store) {
	for i, id := range []string{"c", "a", "e", "b", "d"} {
		apply(t, st, "n1", "b", runBatch(uint64(i+1), id, float64(i), 1, 1, tu.Start(id, float64(i), "m")))
	}
	ids := func(ss []*aggregate.State, err error) string {
		if err != nil {
			return err.Error()
		}
		out := ""
		for _, s := range ss {
			out += s.RunId
		}
		return out
	}
	for _, c := range []struct {
		after string
		limit int
		want  string
	}{{"", 2, "ab"}, {"b", 2, "cd"}, {"d", 2, "e"}, {"e", 2, ""}, {"bb", 2, "cd"}, {"", 0, ""}, {"", 10, "abcde"}} {
		if got := ids(st.RunsAfter(c.after, c.limit)); got != c.want {
			t.Errorf("RunsAfter(%q, %d) = %q, want %q", c.after, c.limit, got, c.want)
		}
	}
	if got := ids(st.ListRuns(nil)); got != "abcde" {
		t.Errorf("ListRuns(nil) = %q, want by id", got)
	}
	if got := ids(st.ListRuns([]string{"e", "a"})); got != "ea" {
		t.Errorf("ListRuns(e, a) = %q, want in the order asked", got)
	}
	var nf *storage.NotFoundError
	if _, err := st.ListRuns([]string{"a", "nope"}); !errors.As(err, &nf) || !slices.Equal(nf.IDs, []string{"nope"}) || !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("ListRuns with an unknown id: %v, want a NotFoundError naming it", err)
	}
	if _, err := st.GetRun("nope"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("GetRun(nope): %v, want ErrNotFound", err)
	}
}

// selectRuns: live runs, ended runs, runs active since a time, a model's
// runs, the order
// by total cost (unknown last, ties by id) and by start (the newest first,
// ties by id), from the summaries written with every
// aggregate, a reprice's included.
func selectRuns(t *testing.T, st storage.Store) {
	// a ends at 2 s, c at 6 s, e at 9 s; b and d are live. A reprice books
	// a at $1, b at $2 and c and e at $10 (1 GPU-s each); d has no cost.
	seq := uint64(0)
	runOf := func(id string, sec float64, end bool, model string) {
		evs := []*trainmeterv1.RunEvent{tu.Start(id, sec, model)}
		if end {
			evs = append(evs, tu.End(id, sec+1))
		}
		seq++
		apply(t, st, "n1", "b", runBatch(seq, id, sec, 1, 1, evs...))
	}
	run := func(id string, sec float64, end bool) { runOf(id, sec, end, "m") }
	run("a", 1, true)
	run("b", 2, false)
	run("c", 5, true)
	run("d", 6, false)
	run("e", 8, true)
	rep := func(s *aggregate.State) *trainmeterv1.RunReport { return s.Report(aggregate.Pricing{}) }
	for id, usd := range map[string]float64{"a": 3600, "b": 7200, "c": 36000, "e": 36000} {
		if _, _, _, err := st.Reprice(id, time.Time{}, usd, "test", rep); err != nil {
			t.Fatalf("reprice %s: %v", id, err)
		}
	}
	for _, c := range []struct {
		name string
		f    storage.RunFilter
		want string
	}{
		{"all by id", storage.RunFilter{}, "abcde"},
		{"live", storage.RunFilter{LiveOnly: true}, "bd"},
		{"active since 6 s", storage.RunFilter{ActiveSince: tu.T0.Add(6 * time.Second)}, "bcde"},
		{"active since 6.5 s", storage.RunFilter{ActiveSince: tu.T0.Add(6500 * time.Millisecond)}, "bde"},
		{"by cost", storage.RunFilter{ByCost: true}, "cebad"},
		{"active since 6.5 s by cost", storage.RunFilter{ActiveSince: tu.T0.Add(6500 * time.Millisecond), ByCost: true}, "ebd"},
		{"live by cost", storage.RunFilter{LiveOnly: true, ByCost: true}, "bd"},
		{"ended", storage.RunFilter{EndedOnly: true}, "ace"},
		{"by start", storage.RunFilter{ByStart: true}, "edcba"},
		{"live by start", storage.RunFilter{LiveOnly: true, ByStart: true}, "db"},
		{"ended by start", storage.RunFilter{EndedOnly: true, ByStart: true}, "eca"},
		{"active since 6.5 s by start", storage.RunFilter{ActiveSince: tu.T0.Add(6500 * time.Millisecond), ByStart: true}, "edb"},
		{"live and ended", storage.RunFilter{LiveOnly: true, EndedOnly: true}, ""},
	} {
		ids, err := st.SelectRuns(c.f)
		if got := strings.Join(ids, ""); err != nil || got != c.want {
			t.Errorf("SelectRuns %s = %q (%v), want %q", c.name, got, err, c.want)
		}
	}
	if _, err := st.DeleteRun("e"); err != nil {
		t.Fatal(err)
	}
	if ids, err := st.SelectRuns(storage.RunFilter{ByCost: true}); strings.Join(ids, "") != "cbad" || err != nil {
		t.Errorf("SelectRuns by cost after deleting e = %q (%v), want cbad", ids, err)
	}
	// A live run that ends, and one deleted while live, are live no more.
	seq++
	apply(t, st, "n1", "b", runBatch(seq, "b", 10, 1, 1, tu.End("b", 11)))
	live := func() string {
		ids, err := st.SelectRuns(storage.RunFilter{LiveOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(ids, "")
	}
	if got := live(); got != "d" {
		t.Errorf("live runs after b ended = %q, want d", got)
	}
	if _, err := st.DeleteLiveRun("d"); err != nil {
		t.Fatal(err)
	}
	if got := live(); got != "" {
		t.Errorf("live runs after d was deleted = %q, want none", got)
	}
	// Runs of the same start are in id order; b now ended at 11 s.
	run("f", 5, true)
	if ids, err := st.SelectRuns(storage.RunFilter{EndedOnly: true, ByStart: true}); strings.Join(ids, "") != "cfba" || err != nil {
		t.Errorf("SelectRuns ended by start with a tie = %q (%v), want cfba", ids, err)
	}
	// A model's runs, live (h) and ended (g, i), and a run of no model (j).
	runOf("g", 12, true, "m2")
	runOf("h", 13, false, "m2")
	runOf("i", 3, true, "m2")
	runOf("j", 14, true, "")
	for _, c := range []struct {
		name string
		f    storage.RunFilter
		want string
	}{
		{"of m", storage.RunFilter{Model: "m"}, "abcf"},
		{"of m2", storage.RunFilter{Model: "m2"}, "ghi"},
		{"ended of m2", storage.RunFilter{Model: "m2", EndedOnly: true}, "gi"},
		{"live of m2", storage.RunFilter{Model: "m2", LiveOnly: true}, "h"},
		{"of m2 by start", storage.RunFilter{Model: "m2", ByStart: true}, "hgi"},
		{"of m2 active since 12.5 s", storage.RunFilter{Model: "m2", ActiveSince: tu.T0.Add(12500 * time.Millisecond)}, "gh"},
		{"of an unknown model", storage.RunFilter{Model: "nope"}, ""},
		{"all", storage.RunFilter{}, "abcfghij"},
	} {
		ids, err := st.SelectRuns(c.f)
		if got := strings.Join(ids, ""); err != nil || got != c.want {
			t.Errorf("SelectRuns %s = %q (%v), want %q", c.name, got, err, c.want)
		}
	}
}

// records: namespaced documents in key order.
func records(t *testing.T, st storage.Store) {
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(st.PutRecord("ns", "b", []byte("2")))
	must(st.PutRecords("ns", map[string][]byte{"a": []byte("1"), "c": []byte("3"), "x": []byte("9")}))
	must(st.PutRecord("other", "a", []byte("other")))
	if won, err := st.PutRecordIfAbsent("ns", "a", []byte("new")); won || err != nil {
		t.Errorf("PutRecordIfAbsent over a record: %v %v, want false", won, err)
	}
	if won, err := st.PutRecordIfAbsent("ns", "d", []byte("4")); !won || err != nil {
		t.Errorf("PutRecordIfAbsent: %v %v, want true", won, err)
	}
	if v, err := st.GetRecord("ns", "a"); err != nil || string(v) != "1" {
		t.Errorf("GetRecord(ns, a) = %q %v, want 1", v, err)
	}
	must(st.DeleteRecord("ns", "x"))
	must(st.DeleteRecord("ns", "never"))
	if _, err := st.GetRecord("ns", "x"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("deleted record: %v, want ErrNotFound", err)
	}
	got := ""
	must(st.ScanRecords("ns", "", func(k string, v []byte) (bool, error) {
		got += k + "=" + string(v) + " "
		return k != "c", nil
	}))
	if got != "a=1 b=2 c=3 " {
		t.Errorf("scan until c: %q", got)
	}
	got = ""
	must(st.ScanRecords("other", "a", func(k string, v []byte) (bool, error) {
		got += k + "=" + string(v)
		return true, nil
	}))
	if got != "a=other" {
		t.Errorf("scan of another namespace: %q", got)
	}
	errStop := errors.New("stop")
	if err := st.ScanRecords("ns", "", func(string, []byte) (bool, error) { return true, errStop }); !errors.Is(err, errStop) {
		t.Errorf("scan's error: %v, want fn's", err)
	}
}

// reprice: a run's windows from a time on are booked at a new price.
func reprice(t *testing.T, st storage.Store) {
	for i := range 3 {
		var evs []*trainmeterv1.RunEvent
		if i == 0 {
			evs = append(evs, tu.Start("r", 0, "m"))
		}
		apply(t, st, "n1", "b", runBatch(uint64(i+1), "r", float64(i), 10, 10, evs...))
	}
	rep := func(s *aggregate.State) *trainmeterv1.RunReport { return s.Report(aggregate.Pricing{}) }
	before, after, ch, err := st.Reprice("r", tu.T0.Add(time.Second), 3600, "contract", rep)
	if err != nil || before == nil || after == nil || ch.GPUSeconds != 2 {
		t.Fatalf("reprice: before %v after %v, %v GPU-s (%v); want 2 GPU-s", before != nil, after != nil, ch.GPUSeconds, err)
	}
	ws, _, err := st.RunTimeline("r")
	if err != nil {
		t.Fatal(err)
	}
	priced := ""
	for _, w := range ws {
		priced += fmt.Sprint(w.Window.GetPriceLocked() && w.Window.GetLockedUsdPerGpuHour() == 3600, " ")
	}
	if priced != "false true true " {
		t.Errorf("windows at the new price: %s, want the last two", priced)
	}
	if _, after, _, err := st.Reprice("r", tu.T0.Add(time.Hour), 1, "later", rep); err != nil || after != nil {
		t.Errorf("reprice after the run: %v (%v), want nothing", after, err)
	}
	if _, _, _, err := st.Reprice("nope", time.Time{}, 1, "x", rep); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("reprice of an unknown run: %v, want ErrNotFound", err)
	}
}

// reopen: what was committed is there after a restart, and a batch
// applied before stays applied.
func reopen(t *testing.T, st storage.Store) {
	r, ok := st.(Reopener)
	if !ok {
		t.Skip("the store cannot be reopened")
	}
	apply(t, st, "n1", "b", runBatch(1, "r", 0, 100, 50, tu.Start("r", 0, "m")))
	apply(t, st, "n2", "b", runBatch(1, "r", 0, 100, 50, tu.Start("r", 0, "m")))
	apply(t, st, "n1", "b", runBatch(2, "gone", 1, 1, 10, tu.Start("gone", 1, "m"), tu.End("gone", 2)))
	if _, err := st.DeleteRun("gone"); err != nil {
		t.Fatal(err)
	}
	if err := st.PutRecord("ns", "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	want := scan(t, st, time.Time{}, time.Time{})
	st = r.Reopen(t)
	if a := apply(t, st, "n1", "b", runBatch(1, "r", 0, 100, 50, tu.Start("r", 0, "m"))); !a.Duplicate {
		t.Error("a batch applied before the restart applied again")
	}
	wantRun(t, st, "r", 200, 2, 2, 2)
	if _, err := st.GetRun("gone"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("deleted run after restart: %v", err)
	}
	if v, err := st.GetRecord("ns", "k"); err != nil || string(v) != "v" {
		t.Errorf("record after restart: %q %v", v, err)
	}
	if got := scan(t, st, time.Time{}, time.Time{}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("usage after restart %+v, want %+v", got, want)
	}
}

// startsBatch is batch seq at sec holding the events (starts, ends).
func startsBatch(seq uint64, sec float64, events ...*trainmeterv1.RunEvent) *trainmeterv1.Batch {
	return tu.Batch(seq, sec, nil, events...)
}

func starts(sec float64, runs ...string) []*trainmeterv1.RunEvent {
	var out []*trainmeterv1.RunEvent
	for _, r := range runs {
		out = append(out, tu.Start(r, sec, "m"))
	}
	return out
}

// refusedRuns lists the runs whose starts a were refused, in order.
func refusedRuns(a storage.Applied) string {
	var ids []string
	for _, r := range a.Refused {
		ids = append(ids, r.RunID)
	}
	return strings.Join(ids, ",")
}

// liveRunsLimit: a node's live runs are bounded: a start beyond is refused
// (the agent is told, naming the limit) and makes no run; another node has
// its own bound; an end or a delete frees a place; the bound holds after a
// restart (the store keeps what is live).
func liveRunsLimit(t *testing.T, open func(Options) storage.Store) {
	o := Options{Limits: fold.Limits{MaxLiveRunsPerNode: 3}}
	st := open(o)
	a := apply(t, st, "n", "b", startsBatch(1, 1, starts(1, "a", "b", "c", "d")...))
	if refusedRuns(a) != "d" || !strings.Contains(a.Refused[0].Reason, "already has 3 live runs") {
		t.Fatalf("refused %+v, want d's start, naming the limit", a.Refused)
	}
	if _, err := st.GetRun("d"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("the refused run: %v, want ErrNotFound", err)
	}
	if a := apply(t, st, "other", "b", startsBatch(1, 1, starts(1, "x")...)); len(a.Refused) != 0 {
		t.Errorf("another node refused: %+v", a.Refused)
	}
	if r, ok := st.(Reopener); ok {
		st = r.Reopen(t)
	}
	if a := apply(t, st, "n", "b", startsBatch(2, 2, starts(2, "e")...)); refusedRuns(a) != "e" {
		t.Fatalf("refused %+v, want e's start", a.Refused)
	}
	// An end frees its place for a later start in the same batch.
	if a := apply(t, st, "n", "b", startsBatch(3, 3, append([]*trainmeterv1.RunEvent{tu.End("a", 3)}, starts(3, "e")...)...)); len(a.Refused) != 0 {
		t.Fatalf("after a's end: refused %+v", a.Refused)
	}
	if a := apply(t, st, "n", "b", startsBatch(4, 4, starts(4, "f")...)); refusedRuns(a) != "f" {
		t.Fatalf("refused %+v, want f's start", a.Refused)
	}
	if _, err := st.DeleteRun("b"); err != nil {
		t.Fatal(err)
	}
	if a := apply(t, st, "n", "b", startsBatch(5, 5, starts(5, "f")...)); len(a.Refused) != 0 {
		t.Fatalf("after b's delete: refused %+v", a.Refused)
	}
	runs, err := st.ListRuns(nil)
	if err != nil || len(runs) != 5 {
		t.Errorf("%d runs (%v), want a, c, e, f, x", len(runs), err)
	}
}

// liveRunsLimitConcurrent: batches of one node applied at once (by several
// collectors on one database) start no more runs than the bound.
func liveRunsLimitConcurrent(t *testing.T, open func(Options) storage.Store) {
	st := open(Options{Limits: fold.Limits{MaxLiveRunsPerNode: 3}})
	const batches = 8
	var wg sync.WaitGroup
	for i := range batches {
		wg.Go(func() {
			run := fmt.Sprint("r", i)
			if _, err := st.ApplyBatchResult(storage.Sender{Node: "n", Boot: "b"}, startsBatch(uint64(i+1), float64(i), starts(float64(i), run)...)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if runs, err := st.ListRuns(nil); err != nil || len(runs) != 3 {
		t.Errorf("%d runs (%v) from %d concurrent starts, want 3 (the bound)", len(runs), err, batches)
	}
}

// newRunsLimit: the new runs a node starts are bounded per minute (a
// bucket refilled over the minute, by the store's clock); starts of the
// node's own live runs and joins of another node's runs are not new.
func newRunsLimit(t *testing.T, open func(Options) storage.Store) {
	clk := clock.NewFake(tu.Now())
	st := open(Options{Limits: fold.Limits{MaxNewRunsPerMinute: 2}, Clock: clk})
	a := apply(t, st, "n", "b", startsBatch(1, 1, starts(1, "a", "b", "c")...))
	if refusedRuns(a) != "c" || !strings.Contains(a.Refused[0].Reason, "limit of 2 new runs a minute") {
		t.Fatalf("refused %+v, want c's start, naming the limit", a.Refused)
	}
	if a := apply(t, st, "n", "b", startsBatch(2, 2, starts(2, "a", "c")...)); refusedRuns(a) != "c" {
		t.Fatalf("refused %+v, want c again and a (live) accepted", a.Refused)
	}
	apply(t, st, "m", "b", startsBatch(1, 2, starts(2, "y", "z")...))
	if a := apply(t, st, "m", "b", startsBatch(2, 2, starts(2, "a")...)); len(a.Refused) != 0 {
		t.Fatalf("a join of n's run refused: %+v", a.Refused)
	}
	clk.Advance(30 * time.Second) // one run's worth refilled
	if a := apply(t, st, "n", "b", startsBatch(3, 3, starts(3, "c", "d")...)); refusedRuns(a) != "d" {
		t.Fatalf("30 s later: refused %+v, want d only", a.Refused)
	}
	clk.Advance(30 * time.Second)
	if a := apply(t, st, "n", "b", startsBatch(4, 4, starts(4, "d", "e")...)); refusedRuns(a) != "e" {
		t.Fatalf("a minute later: refused %+v, want e only", a.Refused)
	}
}
