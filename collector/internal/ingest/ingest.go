// Package ingest implements the IngestService: one bidirectional stream per
// agent. The agent sends a Hello, then numbered batches; each valid batch is
// stored atomically and acked only after the store has committed it (it is
// durable); a malformed batch is rejected for good and nothing of it is
// stored; a batch seen before (same node, boot, seq) is acked again. A store
// failure ends the stream with codes.Unavailable and no ack, so the agent keeps
// the batch in its spool and retries.
package ingest

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// advisoryQueue is how many advisories may wait for one stream.
const advisoryQueue = 64

type session struct {
	id  uint64
	adv chan *trainmeterv1.Advisory
}

type nodeState struct {
	boot string
	gpus []*trainmeterv1.GpuInfo
	// hostEnergy is the hello's host_energy_status.
	hostEnergy string
	lastSeen   time.Time
	lastSeq    uint64
	sessions   []*session // oldest first
}

// Server is the IngestService implementation.
type Server struct {
	trainmeterv1.UnimplementedIngestServiceServer

	store storage.Ingester
	log   *slog.Logger
	clock clock.Clock

	mu     sync.Mutex
	nextID uint64
	nodes  map[string]*nodeState

	closeOnce sync.Once
	closed    chan struct{}

	counters counters // self-metrics (stats.go)

	observers []BatchObserver // set before serving (OnApplied); read-only after

	// maxBatchRunRecords bounds the records naming a run in one batch
	// (SetMaxBatchRunRecords); 0: DefaultMaxBatchRunRecords.
	maxBatchRunRecords int
}

// DefaultMaxBatchRunRecords is `serve --max-batch-run-records`'s default:
// run windows, events, loss records and host energy shares in one batch
// together, far above an agent's second of at most 256 live runs.
const DefaultMaxBatchRunRecords = 20000

// SetMaxBatchRunRecords sets the bound on the records naming a run in one
// batch; a batch with more is rejected whole. Call it before serving.
func (s *Server) SetMaxBatchRunRecords(n int) {
	if n > 0 {
		s.maxBatchRunRecords = n
	}
}

// runRecords counts a batch's records that name a run.
func runRecords(b *trainmeterv1.Batch) int {
	n := len(b.GetRunWindows()) + len(b.GetRunEvents()) + len(b.GetLosses())
	for _, h := range b.GetHostEnergy() {
		n += len(h.GetRuns())
	}
	return n
}

// BatchObserver is told of every batch the store has durably applied for
// the first time (never of duplicates or rejected batches), in the node's
// sequence order, on the stream's goroutine: it must not block (hand heavy
// work to a goroutine of its own). The batch must not be modified.
type BatchObserver func(node string, b *trainmeterv1.Batch)

// OnApplied registers an observer. Call it before the server serves streams.
func (s *Server) OnApplied(o BatchObserver) { s.observers = append(s.observers, o) }

// New returns an ingest server over st. A nil log discards its logs.
func New(st storage.Ingester, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{store: st, log: log, clock: clock.Real{}, nodes: map[string]*nodeState{}, closed: make(chan struct{}), counters: newCounters()}
}

// Close ends every open stream with codes.Unavailable (so that a graceful
// gRPC stop does not wait for agents that never hang up) and refuses new ones.
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.closed) }) }

// Advise queues an advisory for node's newest stream. It never blocks: it
// returns false if the node is not connected or its queue is full.
func (s *Server) Advise(node string, adv *trainmeterv1.Advisory) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[node]
	if n == nil || len(n.sessions) == 0 {
		return false
	}
	select {
	case n.sessions[len(n.sessions)-1].adv <- adv:
		return true
	default:
		return false
	}
}

// Connected reports whether node has an open stream.
func (s *Server) Connected(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[node]
	return n != nil && len(n.sessions) > 0
}

// Nodes returns the in-memory status of the nodes seen since start.
func (s *Server) Nodes() []*trainmeterv1.NodeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*trainmeterv1.NodeStatus, 0, len(s.nodes))
	for name, n := range s.nodes {
		ns := &trainmeterv1.NodeStatus{Node: name, BootId: n.boot, Gpus: n.gpus, LastSeq: n.lastSeq, Connected: len(n.sessions) > 0, HostEnergyStatus: n.hostEnergy}
		if !n.lastSeen.IsZero() {
			ns.LastSeen = timestamppb.New(n.lastSeen)
		}
		out = append(out, ns)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

func (s *Server) register(h *trainmeterv1.Hello) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[h.GetNode()]
	if n == nil {
		n = &nodeState{}
		s.nodes[h.GetNode()] = n
	}
	if n.boot != h.GetBootId() {
		n.lastSeq = 0
	}
	n.boot = h.GetBootId()
	n.gpus = h.GetGpus()
	n.hostEnergy = h.GetHostEnergyStatus()
	n.lastSeen = s.clock.Now()
	s.nextID++
	sess := &session{id: s.nextID, adv: make(chan *trainmeterv1.Advisory, advisoryQueue)}
	n.sessions = append(n.sessions, sess)
	return sess
}

func (s *Server) unregister(node string, sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[node]
	if n == nil {
		return
	}
	for i, x := range n.sessions {
		if x == sess {
			n.sessions = append(n.sessions[:i], n.sessions[i+1:]...)
			break
		}
	}
}

func (s *Server) seen(node string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[node]; n != nil {
		n.lastSeen = s.clock.Now()
		n.lastSeq = seq
	}
}

// Stream implements IngestService.Stream.
func (s *Server) Stream(stream grpc.BidiStreamingServer[trainmeterv1.StreamRequest, trainmeterv1.StreamResponse]) error {
	select {
	case <-s.closed:
		return status.Error(codes.Unavailable, "collector is shutting down")
	default:
	}
	ctx := stream.Context()
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message on the stream must be a Hello")
	}
	if err := validateHello(hello); err != nil {
		return status.Errorf(codes.InvalidArgument, "bad hello: %v", err)
	}
	node, boot := hello.GetNode(), hello.GetBootId()
	sender := storage.Sender{Node: node, Boot: boot}
	log := s.log.With("node", node, "boot", boot)
	if err := s.store.PutHello(hello); err != nil {
		log.Error("store hello", "err", err)
		return status.Errorf(codes.Unavailable, "store: %v", err)
	}
	sess := s.register(hello)
	s.counters.streams.Add(1)
	defer s.unregister(node, sess)
	log.Info("agent connected", "agent_version", hello.GetAgentVersion(), "gpus", len(hello.GetGpus()))
	defer log.Info("agent disconnected")

	// A worker receives, applies and acks batches on its own: no goroutine
	// handoff per batch (docs/benchmarks.md). This goroutine sends the rare
	// advisories and ends the stream when the collector closes. mu
	// serializes their sends; once this handler has returned the worker
	// handles nothing more (the store may be closing).
	var (
		mu       sync.Mutex
		returned bool
	)
	defer func() {
		mu.Lock()
		returned = true
		mu.Unlock()
	}()
	workerDone := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				workerDone <- nil
				return
			}
			if err != nil {
				workerDone <- err
				return
			}
			mu.Lock()
			if returned {
				mu.Unlock()
				return
			}
			resps, err := s.handle(log, sender, m)
			for _, resp := range resps {
				if err != nil {
					break
				}
				err = stream.Send(resp)
			}
			mu.Unlock()
			if err != nil {
				workerDone <- err
				return
			}
		}
	}()
	sendAdvisory := func(adv *trainmeterv1.Advisory) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(&trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Advisory{Advisory: adv}})
	}

	for {
		select {
		case <-s.closed:
			return status.Error(codes.Unavailable, "collector is shutting down")
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case adv := <-sess.adv:
			if err := sendAdvisory(adv); err != nil {
				return err
			}
		case err := <-workerDone:
			return err
		}
	}
}

// handle processes one message after the Hello and returns the responses to
// send, in order, or an error that ends the stream.
func (s *Server) handle(log *slog.Logger, sender storage.Sender, m *trainmeterv1.StreamRequest) ([]*trainmeterv1.StreamResponse, error) {
	node, boot := sender.Node, sender.Boot
	if m.GetHello() != nil {
		return nil, status.Error(codes.InvalidArgument, "hello sent twice on one stream")
	}
	b := m.GetBatch()
	if b == nil {
		return nil, status.Error(codes.InvalidArgument, "empty stream message")
	}
	err := ValidateBatch(b)
	if err == nil {
		limit := s.maxBatchRunRecords
		if limit <= 0 {
			limit = DefaultMaxBatchRunRecords
		}
		if n := runRecords(b); n > limit {
			err = fmt.Errorf("%d records naming a run (run windows, run events, loss records, host energy shares), more than %d in one batch "+
				"(trainmeter serve --max-batch-run-records)", n, limit)
		}
	}
	if err == nil {
		if err = CheckBatchTime(b, s.clock.Now()); err != nil {
			s.counters.rejectedTime.Add(1)
		}
	}
	if err != nil {
		return s.reject(log, sender, b.GetSeq(), err), nil
	}
	t0 := time.Now()
	applied, err := s.store.ApplyBatchResult(sender, b)
	dup := applied.Duplicate
	if errors.Is(err, storage.ErrBatchTooLarge) {
		return s.reject(log, sender, b.GetSeq(), err), nil
	}
	if err != nil {
		s.counters.storeErrors.Add(1)
		s.counters.lastStoreErr.Store(s.clock.Now().UnixNano())
		log.Error("store batch", "seq", b.GetSeq(), "err", err)
		return nil, status.Errorf(codes.Unavailable, "store: %v", err)
	}
	s.counters.lat.Observe(time.Since(t0))
	s.counters.lastStoreOK.Store(s.clock.Now().UnixNano())
	s.noteSeq(log, node, boot, b.GetSeq())
	if dup {
		s.counters.duplicate.Add(1)
		log.Debug("duplicate batch acked again", "seq", b.GetSeq())
	} else {
		s.counters.applied.Add(1)
		// Observers (budgets, the advisor, metrics) see what was applied:
		// never the records the store refused.
		seen := b
		if applied.Batch != nil {
			seen = applied.Batch
		}
		for _, o := range s.observers {
			o(node, seen)
		}
	}
	s.seen(node, b.GetSeq())
	// A refused start goes back before the batch's ack.
	s.noteDropped(log, node, applied)
	out := make([]*trainmeterv1.StreamResponse, 0, len(applied.Refused)+1)
	for _, r := range applied.Refused {
		s.counters.refusedStarts.Add(1)
		// The store logged the refusal itself; a repeat is routine.
		log.Debug("refusal sent to the agent", "run_id", r.RunID, "seq", b.GetSeq(), "dropped_records", r.Records)
		out = append(out, &trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Advisory{Advisory: &trainmeterv1.Advisory{
			RunId: r.RunID,
			Advice: &trainmeterv1.Advisory_StartRefused{StartRefused: &trainmeterv1.StartRefused{
				Reason: r.Reason, Start: timestamppb.New(time.Unix(0, r.Start))}},
		}}})
	}
	out = append(out, &trainmeterv1.StreamResponse{Msg: &trainmeterv1.StreamResponse_Ack{Ack: &trainmeterv1.Ack{Seq: b.GetSeq()}}})
	return out, nil
}

// reject counts and logs a rejected batch and answers it.
func (s *Server) reject(log *slog.Logger, sender storage.Sender, seq uint64, err error) []*trainmeterv1.StreamResponse {
	s.counters.rejected.Add(1)
	if seq > 0 && seq <= maxSeq { // a seq out of range says nothing of the node's gaps
		s.noteSeq(log, sender.Node, sender.Boot, seq)
	}
	log.Warn("batch rejected", "seq", seq, "reason", err.Error())
	return []*trainmeterv1.StreamResponse{{Msg: &trainmeterv1.StreamResponse_Reject{Reject: &trainmeterv1.Reject{Seq: seq, Reason: err.Error()}}}}
}

// noteSeq counts and logs a sequence gap (seqs the collector never saw from
// this boot: legitimate after the agent's spool overflowed).
func (s *Server) noteSeq(log *slog.Logger, node, boot string, seq uint64) {
	if skipped := s.counters.answered(node, boot, seq); skipped > 0 {
		log.Warn("sequence gap: batches missing from this agent (dropped by it, e.g. spool overflow)",
			"seq", seq, "missing", skipped)
	}
}
