// Package uplink streams the agent's batches to the collector. Every batch
// goes into the on-disk spool first (agent/internal/spool) and stays there
// until the collector acks it; unacked batches are re-sent after a reconnect
// and after an agent restart. Delivery is at-least-once; the collector
// deduplicates by (node, boot, seq), the boot id being the spool's.
//
// With a collector pair (Group, mode all) there is one Uplink per
// collector, each on its own cursor of the one spool: every batch goes to
// each collector, each acks on its own, and a collector that is down holds
// up neither the other nor the agent. With replicas on one database (mode
// any) one Uplink on one cursor streams to one collector of the list at a
// time and moves to the next when it fails; what the failed one did not ack
// is re-sent to the next, and the database's batch key makes a re-send of a
// batch it committed a duplicate.
package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/internal/flowcontrol"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Config sets up an Uplink.
type Config struct {
	// Address of the collector, HOST:PORT.
	Address string
	// Alternates are further collectors (mode any): when the one in use
	// fails (refused, stream broken, no ack within AckTimeout) the uplink
	// moves to the next of Address, Alternates..., in turn, and stays there
	// while it works. The one cursor serves them all.
	Alternates []string
	// AckTimeout, when positive, ends a stream on which a sent batch has
	// waited this long with no ack at all, so that a collector that hangs
	// counts as failed; 0: wait as long as the stream is up.
	AckTimeout time.Duration
	// Hello is sent first on every stream; its boot id must be the spool's.
	Hello *trainmeterv1.Hello
	// Spool holds every batch until it is acked (required); the uplink
	// does not close it. Cursor is the spool cursor (collector) it serves.
	Spool  *spool.Spool
	Cursor int
	// MinBackoff and MaxBackoff bound the reconnect delay: its step doubles
	// from MinBackoff (0: 250 ms) to MaxBackoff (0: DefaultMaxBackoff), and
	// each delay is uniform in [step/2, step].
	MinBackoff, MaxBackoff time.Duration
	// OnAdvisory receives advisories the collector sends down.
	OnAdvisory func(*trainmeterv1.Advisory)
	// Creds are the transport credentials (TLS); nil: plaintext.
	Creds credentials.TransportCredentials
	// Token, when set, is sent on the stream as per-RPC credentials.
	Token       credentials.PerRPCCredentials
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
	// Clock times the reconnect backoff and Flush's polling, and stamps a
	// flushed loss report; nil: the wall clock.
	Clock clock.Clock
}

// Stats are the uplink's self-metrics. Acked, Rejected, Dropped and
// DroppedBytes count since the spool was opened; Pending and SpoolBytes are
// what the spool holds now.
type Stats struct {
	Enqueued, Sent, Acked, Rejected, Dropped uint64
	DroppedBytes                             uint64
	Pending                                  int
	SpoolBytes                               int64
	Connects                                 uint64
	Connected                                bool
}

// Uplink owns the stream to the collector.
type Uplink struct {
	cfg      Config
	dialOpts []grpc.DialOption
	// conn is replaced by the stream loop before each reconnect attempt.
	conn *grpc.ClientConn
	cur  *spool.Cursor
	// addrs are Address and Alternates; addrs[at] is the one in use.
	addrs []string

	mu      sync.Mutex
	at      int
	stats   Stats
	notify  chan struct{}
	drained chan struct{} // closed and replaced when the spool may have drained
	// retryNow cuts a reconnect backoff short (Flush).
	retryNow chan struct{}

	// The stream loop between Start and Shutdown.
	runMu     sync.Mutex
	stopRun   context.CancelFunc
	runDone   chan struct{}
	closeConn sync.Once
}

// DefaultMaxBackoff is the longest wait between reconnect attempts when
// Config.MaxBackoff is not set: data flows again within about that long of
// the collector listening after an outage of any length.
const DefaultMaxBackoff = 4 * time.Second

// sendChunk is how many batches are read from the spool at a time.
const sendChunk = 256

// New prepares an uplink; nothing is dialled until Start.
func New(cfg Config) (*Uplink, error) {
	addrs := append([]string{cfg.Address}, cfg.Alternates...)
	if slices.Contains(addrs, "") {
		return nil, errors.New("uplink: collector address is empty")
	}
	if cfg.Spool == nil {
		return nil, errors.New("uplink: no spool")
	}
	if cfg.Cursor < 0 || cfg.Cursor >= cfg.Spool.Cursors() {
		return nil, fmt.Errorf("uplink: cursor %d, but the spool has %d", cfg.Cursor, cfg.Spool.Cursors())
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 250 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	creds := cmp.Or(cfg.Creds, insecure.NewCredentials())
	// Fixed flow-control windows: no PING after every ack (package flowcontrol).
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, flowcontrol.DialOptions()...)
	if cfg.Token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(cfg.Token))
	}
	opts = append(opts, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Address, opts...)
	if err != nil {
		return nil, err
	}
	return &Uplink{cfg: cfg, dialOpts: opts, conn: conn, cur: cfg.Spool.Cursor(cfg.Cursor), addrs: addrs, notify: make(chan struct{}, 1),
		drained: make(chan struct{}), retryNow: make(chan struct{}, 1)}, nil
}

// Enqueue appends a batch to the spool (which assigns its seq) and wakes the
// sender; it never waits for the network or an fsync. A spool error is
// logged; the spool counts it and reports the loss with the next batch.
func (u *Uplink) Enqueue(b *trainmeterv1.Batch) {
	if err := u.cfg.Spool.Append(b); err != nil {
		u.cfg.Logger.Error("uplink: batch not spooled", "err", err)
	}
	u.enqueued()
}

// enqueued counts a batch put in the spool and wakes the sender.
func (u *Uplink) enqueued() {
	u.mu.Lock()
	u.stats.Enqueued++
	u.mu.Unlock()
	u.notifySender()
}

func (u *Uplink) notifySender() {
	select {
	case u.notify <- struct{}{}:
	default:
	}
}

// Connected reports whether a stream to the collector is open now.
func (u *Uplink) Connected() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.stats.Connected
}

// Address is the collector this uplink streams to: of several
// (Alternates), the one in use now.
func (u *Uplink) Address() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.addrs[u.at]
}

// inUse is the index of the collector in use in Address, Alternates....
func (u *Uplink) inUse() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.at
}

// moveOn makes the next collector of the list the one in use and returns it.
func (u *Uplink) moveOn() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.at = (u.at + 1) % len(u.addrs)
	return u.addrs[u.at]
}

// Stats returns a snapshot of the self-metrics: Pending, Acked and Rejected
// are this collector's; SpoolBytes, Dropped and DroppedBytes the spool's.
func (u *Uplink) Stats() Stats {
	sp := u.cfg.Spool.Stats()
	cs := u.cur.Stats()
	pending := u.cur.Len()
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.stats
	s.Pending = pending
	s.SpoolBytes = sp.Bytes
	s.Acked, s.Rejected = cs.Acked, cs.Rejected
	s.Dropped, s.DroppedBytes = sp.Dropped, sp.DroppedBytes
	return s
}

// Flush waits until this collector has acked every spooled batch (or it
// was dropped), or ctx ends. What is not acked stays in the spool.
func (u *Uplink) Flush(ctx context.Context) error {
	// A loss report waiting for a next batch gets one now.
	if err := u.cfg.Spool.FlushPending(u.cfg.Clock.Now()); err != nil {
		u.cfg.Logger.Error("uplink: spooling the pending loss report", "err", err)
	}
	u.notifySender()
	// Do not sit out a long reconnect backoff while flushing.
	select {
	case u.retryNow <- struct{}{}:
	default:
	}
	t := u.cfg.Clock.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		u.mu.Lock()
		ch := u.drained
		u.mu.Unlock()
		if u.cur.Len() == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-t.C(): // drops and rejects drain the spool too
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Start keeps a stream to the collector open in the background,
// reconnecting with jittered exponential backoff, until Shutdown; ctx
// bounds only the start. A second Start is a no-op.
func (u *Uplink) Start(ctx context.Context) error {
	u.runMu.Lock()
	defer u.runMu.Unlock()
	if u.runDone != nil {
		return nil
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	u.stopRun, u.runDone = cancel, done
	go func() {
		defer close(done)
		u.run(runCtx)
	}()
	return nil
}

// Shutdown closes the stream and waits for the loop; batches not acked
// stay in the spool (Flush first to wait for them). Safe without a Start.
func (u *Uplink) Shutdown(ctx context.Context) error {
	u.runMu.Lock()
	stop, done := u.stopRun, u.runDone
	u.runMu.Unlock()
	if stop == nil {
		u.closeConn.Do(func() { u.conn.Close() })
		return nil
	}
	stop()
	return lifecycle.Wait(ctx, done, "uplink")
}

func (u *Uplink) run(ctx context.Context) {
	defer u.closeConn.Do(func() { u.conn.Close() })
	backoff := u.cfg.MinBackoff
	tried := 0 // collectors of the list that failed in turn since the last ack
	for ctx.Err() == nil {
		acked, err := u.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if acked {
			backoff, tried = u.cfg.MinBackoff, 0
		}
		failed := u.Address()
		next := u.moveOn()
		if tried++; tried < len(u.addrs) {
			// Another collector of the list may be up: try it at once.
			u.cfg.Logger.Warn("uplink: collector stream ended, moving to the next collector", "collector", failed, "err", err, "next", next)
			u.redial()
			continue
		}
		tried = 0
		u.cfg.Logger.Warn("uplink: collector stream ended, reconnecting", "collector", failed, "err", err, "next", next, "retry_in", backoff)
		// Jitter (a delay uniform in [backoff/2, backoff]) keeps a fleet of
		// agents from reconnecting in lockstep after a collector restart;
		// no delay exceeds MaxBackoff.
		delay := backoff/2 + time.Duration(rand.Int64N(int64(backoff-backoff/2)+1))
		select {
		case <-u.cfg.Clock.After(delay):
		case <-u.retryNow:
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, u.cfg.MaxBackoff)
		u.redial()
	}
}

// redial gives the next attempt a new connection. On the old one gRPC's
// own reconnect backoff (growing to 2 min while the collector is down)
// fails streams at once until its next try, however long the collector has
// been back; a new connection tries at once, so the loop's backoff alone
// paces the attempts.
func (u *Uplink) redial() {
	addr := u.Address()
	conn, err := grpc.NewClient(addr, u.dialOpts...)
	if err != nil {
		u.cfg.Logger.Error("uplink: new connection to the collector", "collector", addr, "err", err)
		return
	}
	u.conn.Close()
	u.conn = conn
}

// session runs one stream. It reports whether any batch was acked on it.
func (u *Uplink) session(parent context.Context) (acked bool, err error) {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	defer func() {
		if cause := context.Cause(ctx); errors.Is(cause, errNoAck) {
			err = cause
		}
	}()
	stream, err := trainmeterv1.NewIngestServiceClient(u.conn).Stream(ctx)
	if err != nil {
		return false, err
	}
	recvErr := make(chan error, 1)
	var gotAck atomic.Bool
	var acks ackWatch
	if u.cfg.AckTimeout > 0 {
		go u.watchAcks(ctx, cancel, &acks)
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch msg := m.Msg.(type) {
			case *trainmeterv1.StreamResponse_Ack:
				u.remove(msg.Ack.Seq, "")
				gotAck.Store(true)
				acks.answered(u.cfg.Clock.Now())
			case *trainmeterv1.StreamResponse_Reject:
				u.cfg.Logger.Error("uplink: collector rejected a batch; dropping it", "seq", msg.Reject.Seq, "reason", msg.Reject.Reason)
				u.remove(msg.Reject.Seq, msg.Reject.Reason)
				acks.answered(u.cfg.Clock.Now())
			case *trainmeterv1.StreamResponse_Advisory:
				if u.cfg.OnAdvisory != nil {
					u.cfg.OnAdvisory(msg.Advisory)
				}
			}
		}
	}()
	defer func() { acked = gotAck.Load() }()
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: u.cfg.Hello}}); err != nil {
		return false, streamErr(err, recvErr)
	}
	u.setConnected(true)
	defer u.setConnected(false)

	var sentUpTo uint64 // every spooled batch with seq <= sentUpTo went out on this stream
	for {
		batch, err := u.cur.ReadAfter(sentUpTo, sendChunk)
		if err != nil {
			u.cfg.Logger.Error("uplink: reading the spool", "err", err)
		}
		for _, b := range batch {
			sentUpTo = b.Seq
			if n := proto.Size(b); n > MaxBatchBytes {
				// The collector would end the stream on it every time and
				// nothing behind it would ever get through.
				u.cfg.Logger.Error("uplink: batch too large to send; dropping it", "seq", b.Seq, "bytes", n, "limit", MaxBatchBytes)
				u.remove(b.Seq, fmt.Sprintf("batch of %d bytes exceeds the %d-byte message limit", n, MaxBatchBytes))
				continue
			}
			// Marked before the send: once it may be on the wire, a drop
			// of it is reported as in doubt.
			u.cur.MarkSent(b.Seq)
			acks.sent(u.cfg.Clock.Now())
			if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: b}}); err != nil {
				return false, streamErr(err, recvErr)
			}
			u.mu.Lock()
			u.stats.Sent++
			u.mu.Unlock()
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-u.notify:
		case err := <-recvErr:
			return false, closedErr(err)
		case <-ctx.Done():
			_ = stream.CloseSend()
			return false, ctx.Err()
		}
	}
}

// errNoAck ends a stream on which a batch waited AckTimeout for its ack.
var errNoAck = errors.New("no ack in time")

// ackWatch tracks a stream's batches awaiting their ack: how many, and
// since when the collector last answered (or a send found none waiting).
type ackWatch struct {
	waiting atomic.Int64
	since   atomic.Int64 // unix ns
}

func (w *ackWatch) sent(now time.Time) {
	if w.waiting.Add(1) == 1 {
		w.since.Store(now.UnixNano())
	}
}

func (w *ackWatch) answered(now time.Time) {
	w.waiting.Add(-1)
	w.since.Store(now.UnixNano())
}

// watchAcks cancels the stream once a batch has waited AckTimeout with no
// answer from the collector, so the uplink moves on to the next collector
// rather than waiting on one that hangs.
func (u *Uplink) watchAcks(ctx context.Context, cancel context.CancelCauseFunc, w *ackWatch) {
	t := u.cfg.Clock.NewTicker(max(u.cfg.AckTimeout/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C():
			if w.waiting.Load() > 0 && now.Sub(time.Unix(0, w.since.Load())) >= u.cfg.AckTimeout {
				cancel(fmt.Errorf("%w: a batch waited %v on %s", errNoAck, u.cfg.AckTimeout, u.Address()))
				return
			}
		}
	}
}

// MaxBatchBytes is the largest batch the uplink sends: under the collector's
// 16 MiB receive limit, with room for the envelope.
const MaxBatchBytes = 15 << 20

// streamErr prefers the status the collector ended the stream with (say,
// Unauthenticated): once the server has ended a stream, Send reports only
// io.EOF and the status arrives on the receiving side.
func streamErr(err error, recvErr <-chan error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	select {
	case rerr := <-recvErr:
		return closedErr(rerr)
	case <-time.After(time.Second):
		return closedErr(err)
	}
}

// closedErr says in words that the collector ended the stream cleanly.
func closedErr(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("collector closed the stream")
	}
	return err
}

// remove takes an acked (reason == "") or rejected batch out of the spool.
func (u *Uplink) remove(seq uint64, rejectReason string) {
	if rejectReason != "" {
		u.cur.Reject(seq, rejectReason)
	} else {
		u.cur.Ack(seq)
	}
	if u.cur.Len() == 0 {
		u.mu.Lock()
		close(u.drained)
		u.drained = make(chan struct{})
		u.mu.Unlock()
	}
}

func (u *Uplink) setConnected(c bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stats.Connected = c
	if c {
		u.stats.Connects++
	}
}
