// Package query implements the QueryService the trainmeter CLI reads through.
package query

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/advice/dataloadersvc"
	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/page"
	"github.com/trainmeter/trainmeter/collector/internal/parallel"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/query/compare"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/plural"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Live tells which nodes have an open ingest stream (the ingest server).
type Live interface {
	Nodes() []*trainmeterv1.NodeStatus
}

// Server is the QueryService implementation.
type Server struct {
	trainmeterv1.UnimplementedQueryServiceServer
	store   storage.Store
	live    Live
	pricing aggregate.Pricing
	plans   Plans
	log     *slog.Logger // SetLogger
}

// Plans adds to a report what its run was started with (cost cap,
// estimate): the budget manager.
type Plans interface {
	AttachPlan(r *trainmeterv1.RunReport)
}

// SetPlans sets where reports get their run's plan; call before serving.
func (s *Server) SetPlans(p Plans) { s.plans = p }

func (s *Server) attachPlan(r *trainmeterv1.RunReport) {
	if s.plans != nil {
		s.plans.AttachPlan(r)
	}
}

// New returns a query server. live may be nil (no node is then connected).
func New(st storage.Store, live Live, p aggregate.Pricing) *Server {
	return &Server{store: st, live: live, pricing: p, log: slog.New(slog.DiscardHandler)}
}

func (s *Server) storeErr(err error) error {
	var nf *storage.NotFoundError
	switch {
	case errors.As(err, &nf):
		return status.Errorf(codes.NotFound, "unknown %s: %q", plural.Noun(int64(len(nf.IDs)), "run"), nf.IDs)
	case errors.Is(err, storage.ErrNotFound):
		return status.Error(codes.NotFound, "run not found")
	}
	return status.Errorf(codes.Internal, "store: %v", err)
}

// runErr is storeErr for a read of run id.
func (s *Server) runErr(id string, err error) error {
	if errors.Is(err, storage.ErrNotFound) {
		return status.Errorf(codes.NotFound, "run %q not found", id)
	}
	return s.storeErr(err)
}

func checkIDs(ids []string) error {
	if slices.Contains(ids, "") {
		return status.Error(codes.InvalidArgument, "empty run id")
	}
	return nil
}

// reports turns aggregates into reports. Without explicit ids runs are
// ordered by start time, then run id.
func (s *Server) reports(ids []string) ([]*trainmeterv1.RunReport, error) {
	if err := checkIDs(ids); err != nil {
		return nil, err
	}
	sts, err := s.store.ListRuns(ids)
	if err != nil {
		return nil, s.storeErr(err)
	}
	return s.reportsOf(sts, len(ids) == 0)
}

// reportsOf is the reports of sts, which are every run when all is set
// (then ordered by start time, then run id).
func (s *Server) reportsOf(sts []*aggregate.State, all bool) ([]*trainmeterv1.RunReport, error) {
	out := make([]*trainmeterv1.RunReport, 0, len(sts))
	for _, st := range sts {
		r := st.Report(s.pricing)
		s.attachPlan(r)
		out = append(out, r)
	}
	if err := s.setEfficiency(out, all); err != nil {
		return nil, err
	}
	if all {
		slices.SortStableFunc(out, func(a, b *trainmeterv1.RunReport) int {
			return cmp.Or(a.GetStart().AsTime().Compare(b.GetStart().AsTime()), cmp.Compare(a.GetRunId(), b.GetRunId()))
		})
	}
	return out, nil
}

// timeOf is ts as a time; zero when ts is nil.
func timeOf(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// maxBestModels bounds the per-model bests a page token carries; a listing
// of more models reads every run again on each page that scores runs.
const maxBestModels = 1000

// ListRuns implements QueryService.ListRuns, a page at a time: every run in
// run id order, or the runs the request names in its order.
func (s *Server) ListRuns(_ context.Context, req *trainmeterv1.ListRunsRequest) (*trainmeterv1.ListRunsResponse, error) {
	size, err := page.Size(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	ids := req.GetRunIds()
	if err := checkIDs(ids); err != nil {
		return nil, err
	}
	f, selects, err := runFilter(req)
	if err != nil {
		return nil, err
	}
	fp := page.Request("ListRuns", ids...)
	if selects {
		fp = page.Request("ListRuns", "select", strconv.FormatBool(f.LiveOnly), strconv.FormatBool(f.EndedOnly),
			strconv.FormatInt(f.ActiveSince.UnixNano(), 10), strconv.FormatBool(f.ByCost), strconv.FormatBool(f.ByStart))
	}
	tok, err := page.Decode(req.GetPageToken(), fp)
	if err != nil {
		return nil, err
	}
	switch skip := req.GetSkip(); {
	case skip < 0:
		return nil, status.Errorf(codes.InvalidArgument, "skip %d is negative", skip)
	case skip > 0 && !selects && len(ids) == 0:
		return nil, status.Error(codes.InvalidArgument, "skip is for a filtered or ordered listing or run_ids, not the listing of every run by id")
	case skip > 0 && req.GetPageToken() != "":
		return nil, status.Error(codes.InvalidArgument, "skip is for the first page only: the page token holds the position")
	case skip > 0:
		tok.Offset = int(skip)
	}
	var total *int32
	var sts []*aggregate.State
	var more bool
	switch {
	case selects:
		if tok.After != "" {
			return nil, page.Invalid(req.GetPageToken(), "is not of a filtered listing")
		}
		sel, err := s.store.SelectRuns(f)
		if err != nil {
			return nil, s.storeErr(err)
		}
		total = proto.Int32(int32(len(sel)))
		// The selection is as of this call: a page past its end (runs
		// deleted since the last page) is the last, empty.
		start := min(tok.Offset, len(sel))
		end := min(len(sel), start+size)
		sts, err = s.listSelected(sel[start:end])
		more = end < len(sel)
		if err != nil {
			return nil, s.storeErr(err)
		}
	case len(ids) > 0:
		if tok.After != "" {
			return nil, page.Invalid(req.GetPageToken(), "is not of a run_ids listing")
		}
		if tok.Offset > len(ids) {
			if req.GetPageToken() != "" {
				return nil, page.Invalid(req.GetPageToken(), "is past the end of run_ids")
			}
			tok.Offset = len(ids) // skip past the end: an empty page
		}
		total = proto.Int32(int32(len(ids)))
		end := min(len(ids), tok.Offset+size)
		// The store's ListRuns of no ids is every run: a skip to the end
		// asks for none.
		if tok.Offset < end {
			sts, err = s.store.ListRuns(ids[tok.Offset:end])
		}
		more = end < len(ids)
	default:
		sts, err = s.store.RunsAfter(tok.After, size+1)
		more = len(sts) > size
		sts = sts[:min(len(sts), size)]
	}
	if err != nil {
		return nil, s.storeErr(err)
	}
	runs := make([]*trainmeterv1.RunReport, len(sts))
	parallel.Each(len(sts), 64, func(i int) {
		runs[i] = sts[i].Report(s.pricing)
		s.attachPlan(runs[i])
	})
	first := req.GetPageToken() == ""
	switch {
	case tok.HasBest:
	case len(ids) == 0 && !selects && first && !more:
		// One page holds every run: it is its own comparison.
		tok.Best, tok.HasBest = cost.BestPointsPerUSD(runs), true
	case needEfficiency(runs):
		all, err := s.store.ListRuns(nil)
		if err != nil {
			return nil, s.storeErr(err)
		}
		tok.Best, tok.HasBest = cost.BestPointsPerUSD(s.plainReports(all)), true
	}
	cost.SetEfficiencyBest(runs, tok.Best)
	sizes := make([]int, len(runs))
	parallel.Each(len(runs), 64, func(i int) { sizes[i] = proto.Size(runs[i]) })
	var b page.Budget
	n := 0
	for n < len(runs) && b.FitsSize(sizes[n]) {
		n++
	}
	if n < len(runs) {
		more, runs = true, runs[:n]
	}
	resp := &trainmeterv1.ListRunsResponse{Runs: runs, TotalSize: total}
	if more {
		next := page.Token{Req: fp, Best: tok.Best, HasBest: tok.HasBest && len(tok.Best) <= maxBestModels}
		if !next.HasBest {
			next.Best = nil
		}
		if len(ids) > 0 || selects {
			next.Offset = tok.Offset + len(runs)
		} else {
			next.After = runs[len(runs)-1].GetRunId()
		}
		resp.NextPageToken = page.Encode(next)
	}
	return resp, nil
}

// runFilter is a ListRuns request's filter and order, and whether it has
// any (none may come with run_ids).
func runFilter(req *trainmeterv1.ListRunsRequest) (storage.RunFilter, bool, error) {
	f := storage.RunFilter{LiveOnly: req.GetLiveOnly(), EndedOnly: req.GetEndedOnly()}
	if f.LiveOnly && f.EndedOnly {
		return f, false, status.Error(codes.InvalidArgument, "live_only and ended_only together select no run")
	}
	if t := req.GetActiveSince(); t != nil {
		if err := t.CheckValid(); err != nil {
			return f, false, status.Errorf(codes.InvalidArgument, "active_since: %v", err)
		}
		f.ActiveSince = t.AsTime()
	}
	switch req.GetOrder() {
	case trainmeterv1.RunOrder_RUN_ORDER_UNSPECIFIED:
	case trainmeterv1.RunOrder_RUN_ORDER_COST_DESC:
		f.ByCost = true
	case trainmeterv1.RunOrder_RUN_ORDER_START_DESC:
		f.ByStart = true
	default:
		return f, false, status.Errorf(codes.InvalidArgument, "unknown order %d", req.GetOrder())
	}
	selects := f != (storage.RunFilter{})
	if selects && len(req.GetRunIds()) > 0 {
		return f, false, status.Error(codes.InvalidArgument, "live_only, ended_only, active_since and order select among all runs: not with run_ids")
	}
	return f, selects, nil
}

// listSelected is ListRuns of ids that SelectRuns gave: a run deleted
// since is left out (the store's ListRuns of no ids is every run, so none is asked for).
func (s *Server) listSelected(ids []string) ([]*aggregate.State, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	sts, err := s.store.ListRuns(ids)
	var nf *storage.NotFoundError
	if !errors.As(err, &nf) {
		return sts, err
	}
	return s.listSelected(slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(nf.IDs, id) }))
}

// GetRun implements QueryService.GetRun.
func (s *Server) GetRun(_ context.Context, req *trainmeterv1.GetRunRequest) (*trainmeterv1.GetRunResponse, error) {
	if req.GetRunId() == "" {
		return nil, status.Error(codes.InvalidArgument, "run_id is empty")
	}
	st, err := s.store.GetRun(req.GetRunId())
	if err != nil {
		return nil, s.runErr(req.GetRunId(), err)
	}
	r := st.Report(s.pricing)
	s.attachPlan(r)
	if err := s.setEfficiency([]*trainmeterv1.RunReport{r}, false); err != nil {
		return nil, err
	}
	if err := s.attachDataloaderChanges(r); err != nil {
		return nil, err
	}
	return &trainmeterv1.GetRunResponse{Run: r}, nil
}

// attachDataloaderChanges adds the loader changes applied on the live
// advisor's advice, with their measured gain, to one run's report (only
// GetRun: the history is a scan per run, too dear for every row of a list).
func (s *Server) attachDataloaderChanges(r *trainmeterv1.RunReport) error {
	h, err := dataloadersvc.History(s.store, r.GetRunId())
	if err != nil {
		return s.storeErr(err)
	}
	r.DataloaderChanges = h.GetChanges()
	return nil
}

// needEfficiency is whether any of reports has an efficiency score to
// compute (accuracy and a cost).
func needEfficiency(reports []*trainmeterv1.RunReport) bool {
	return slices.ContainsFunc(reports, func(r *trainmeterv1.RunReport) bool { return r.AccuracyPoints != nil && r.GetTotalCostUsd() > 0 })
}

// plainReports is the reports of sts without their plans: what efficiency
// scores compare.
func (s *Server) plainReports(sts []*aggregate.State) []*trainmeterv1.RunReport {
	out := make([]*trainmeterv1.RunReport, 0, len(sts))
	for _, st := range sts {
		out = append(out, st.Report(s.pricing))
	}
	return out
}

// setEfficiency fills efficiency_score, which compares a run with every run
// of its model: when reports is not already every run, all runs are read.
func (s *Server) setEfficiency(reports []*trainmeterv1.RunReport, complete bool) error {
	if !needEfficiency(reports) {
		return nil
	}
	all := reports
	if !complete {
		sts, err := s.store.ListRuns(nil)
		if err != nil {
			return s.storeErr(err)
		}
		all = s.plainReports(sts)
	}
	cost.SetEfficiency(reports, all)
	return nil
}

// ExportRuns implements QueryService.ExportRuns.
func (s *Server) ExportRuns(req *trainmeterv1.ExportRunsRequest, stream grpc.ServerStreamingServer[trainmeterv1.ExportRunsResponse]) error {
	runs, err := s.reports(req.GetRunIds())
	if err != nil {
		return err
	}
	for _, r := range runs {
		if err := stream.Send(&trainmeterv1.ExportRunsResponse{Run: r}); err != nil {
			return err
		}
	}
	return nil
}

// ListNodes implements QueryService.ListNodes: the stored status of every
// node, with connected (and fresher last_seen/last_seq) from the ingest server.
// Nodes are ordered by name, a page at a time.
func (s *Server) ListNodes(_ context.Context, req *trainmeterv1.ListNodesRequest) (*trainmeterv1.ListNodesResponse, error) {
	size, err := page.Size(req.GetPageSize())
	if err != nil {
		return nil, err
	}
	fp := page.Request("ListNodes")
	tok, err := page.Decode(req.GetPageToken(), fp)
	if err != nil {
		return nil, err
	}
	stored, err := s.store.Nodes()
	if err != nil {
		return nil, s.storeErr(err)
	}
	byName := map[string]*trainmeterv1.NodeStatus{}
	for _, n := range stored {
		byName[n.GetNode()] = n
	}
	if s.live != nil {
		for _, l := range s.live.Nodes() {
			n := byName[l.GetNode()]
			if n == nil {
				byName[l.GetNode()] = l
				continue
			}
			n.Connected = l.GetConnected()
			if l.GetLastSeen() != nil && (n.GetLastSeen() == nil || l.GetLastSeen().AsTime().After(n.GetLastSeen().AsTime())) {
				n.LastSeen = l.GetLastSeen()
			}
			if l.GetBootId() != "" {
				// The store writes last_seq at most every 10 s; the live
				// one is newer for the same boot, and the only one for a
				// new boot.
				if l.GetBootId() != n.GetBootId() || l.GetLastSeq() > n.GetLastSeq() {
					n.LastSeq = l.GetLastSeq()
				}
				n.BootId = l.GetBootId()
				if len(l.GetGpus()) > 0 {
					n.Gpus = l.GetGpus()
				}
				n.HostEnergyStatus = l.GetHostEnergyStatus()
			}
		}
	}
	out := slices.SortedFunc(maps.Values(byName), func(a, b *trainmeterv1.NodeStatus) int { return cmp.Compare(a.GetNode(), b.GetNode()) })
	i := 0
	if req.GetPageToken() != "" {
		i = sort.Search(len(out), func(i int) bool { return out[i].GetNode() > tok.After })
	}
	resp := &trainmeterv1.ListNodesResponse{}
	var b page.Budget
	for ; i < len(out) && len(resp.Nodes) < size && b.Fits(out[i]); i++ {
		resp.Nodes = append(resp.Nodes, out[i])
	}
	if i < len(out) {
		resp.NextPageToken = page.Encode(page.Token{Req: fp, After: resp.Nodes[len(resp.Nodes)-1].GetNode()})
	}
	return resp, nil
}

// DeleteRun implements QueryService.DeleteRun (an admin RPC).
func (s *Server) DeleteRun(_ context.Context, req *trainmeterv1.DeleteRunRequest) (*trainmeterv1.DeleteRunResponse, error) {
	if req.GetRunId() == "" {
		return nil, status.Error(codes.InvalidArgument, "run_id is empty")
	}
	st, err := s.store.GetRun(req.GetRunId())
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return nil, s.storeErr(err)
	}
	del := s.store.DeleteRun
	if err == nil && !st.Ended() {
		if !req.GetForce() {
			return nil, status.Errorf(codes.FailedPrecondition, "run %q is still running: wait for it to end, "+
				"or delete-run --force to end it at the collector and delete it (data its agents send for it afterwards is dropped)", req.GetRunId())
		}
		del = s.store.DeleteLiveRun
	}
	n, err := del(req.GetRunId())
	if err != nil {
		return nil, s.runErr(req.GetRunId(), err)
	}
	return &trainmeterv1.DeleteRunResponse{RecordsDeleted: uint64(n)}, nil
}

// Compare implements QueryService.Compare (collector/internal/query/compare) over the
// runs' reports as GetRun computes them, so that its figures match
// `trainmeter report` (their plan and efficiency score aside: compare reads
// neither). It reads only the compared runs: the named ones, or the ended
// runs of the model as the store selects them.
func (s *Server) Compare(_ context.Context, req *trainmeterv1.CompareRequest) (*trainmeterv1.CompareResponse, error) {
	var all []*trainmeterv1.RunReport
	var err error
	switch ids, model := req.GetRunIds(), req.GetModel(); {
	case len(ids) > 0 && model == "":
		all, err = s.compareReports(ids)
	case len(ids) == 0 && model != "":
		all, err = s.modelReports(model)
	} // otherwise compare.Select refuses the request whatever the runs are
	if err != nil {
		return nil, err
	}
	runs, err := compare.Select(req, all)
	if err == nil {
		var resp *trainmeterv1.CompareResponse
		if resp, err = compare.Compare(req, runs); err == nil {
			return resp, nil
		}
	}
	if errors.Is(err, compare.ErrInvalid) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return nil, status.Errorf(codes.Internal, "compare: %v", err)
}

// modelReports is the reports of model's ended runs, ordered by start, then
// run id, as among every run's: what compare.Select keeps of a model.
func (s *Server) modelReports(model string) ([]*trainmeterv1.RunReport, error) {
	ids, err := s.store.SelectRuns(storage.RunFilter{Model: model, EndedOnly: true})
	if err != nil {
		return nil, s.storeErr(err)
	}
	out, err := s.compareReports(ids)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b *trainmeterv1.RunReport) int {
		return cmp.Or(a.GetStart().AsTime().Compare(b.GetStart().AsTime()), cmp.Compare(a.GetRunId(), b.GetRunId()))
	})
	return out, nil
}

// compareChunk is how many runs one read of compareReports asks for.
const compareChunk = 256

// compareReports is the reports of the runs of ids that exist, each once,
// without plan or efficiency score, in no particular order: compare.Select
// then names the unknown ones and any named twice as it would among every
// run, and a comparison reads only the runs it compares. A model's
// thousands of runs are read and reported a chunk at a time on all cores
// (each chunk its own read: the runs are independent of each other).
func (s *Server) compareReports(ids []string) ([]*trainmeterv1.RunReport, error) {
	want := slices.DeleteFunc(slices.Compact(slices.Sorted(slices.Values(ids))), func(id string) bool { return id == "" })
	chunks := slices.Collect(slices.Chunk(want, compareChunk))
	parts := make([][]*trainmeterv1.RunReport, len(chunks))
	errs := make([]error, len(chunks))
	parallel.Each(len(chunks), 1, func(i int) { parts[i], errs[i] = s.existingReports(chunks[i]) })
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Concat(parts...), nil
}

// existingReports is the reports of the runs of want (distinct ids) that
// exist.
func (s *Server) existingReports(want []string) ([]*trainmeterv1.RunReport, error) {
	for len(want) > 0 {
		sts, err := s.store.ListRuns(want)
		var nf *storage.NotFoundError
		if n := len(want); errors.As(err, &nf) {
			// Read again without them (a run may be deleted meanwhile: again).
			if want = slices.DeleteFunc(slices.Clone(want), func(id string) bool { return slices.Contains(nf.IDs, id) }); len(want) < n {
				continue
			}
		}
		if err != nil {
			return nil, s.storeErr(err)
		}
		out := make([]*trainmeterv1.RunReport, len(sts))
		for i, st := range sts {
			out[i] = st.Report(s.pricing)
		}
		return out, nil
	}
	return nil, nil
}
