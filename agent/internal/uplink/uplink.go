// Package uplink streams the agent's batches to the collector and keeps every
// batch until the collector acks it, re-sending unacked batches after a
// reconnect. Delivery is at-least-once; the collector deduplicates by
// (node, boot, seq).
package uplink

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Config sets up an Uplink.
type Config struct {
	// Address of the collector, HOST:PORT.
	Address string
	// Hello is sent first on every stream.
	Hello *pb.Hello
	// MaxPending bounds the batches held until acked (default 86400, a day
	// of 1 s batches); past it the oldest is dropped and counted.
	MaxPending int
	// MinBackoff and MaxBackoff bound the jittered exponential reconnect delay.
	MinBackoff, MaxBackoff time.Duration
	// OnAdvisory receives advisories the collector sends down.
	OnAdvisory  func(*pb.Advisory)
	DialOptions []grpc.DialOption
	Logger      *slog.Logger
}

// Stats are the uplink's self-metrics.
type Stats struct {
	Enqueued, Sent, Acked, Rejected, Dropped uint64
	Pending                                  int
	Connects                                 uint64
	Connected                                bool
}

// Uplink owns the stream to the collector.
type Uplink struct {
	cfg  Config
	conn *grpc.ClientConn

	mu      sync.Mutex
	pending []*pb.Batch // ascending seq, not yet acked
	stats   Stats
	notify  chan struct{}
	drained chan struct{} // closed and replaced when pending becomes empty
}

// New prepares an uplink; nothing is dialled until Run.
func New(cfg Config) (*Uplink, error) {
	if cfg.Address == "" {
		return nil, errors.New("uplink: collector address is empty")
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 86400
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 250 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Address, opts...)
	if err != nil {
		return nil, err
	}
	return &Uplink{cfg: cfg, conn: conn, notify: make(chan struct{}, 1), drained: make(chan struct{})}, nil
}

// Enqueue hands a batch over for delivery. It never blocks.
func (u *Uplink) Enqueue(b *pb.Batch) {
	u.mu.Lock()
	if len(u.pending) >= u.cfg.MaxPending {
		u.cfg.Logger.Warn("uplink: pending batches at limit, dropping the oldest", "seq", u.pending[0].Seq, "limit", u.cfg.MaxPending)
		u.pending = u.pending[1:]
		u.stats.Dropped++
	}
	u.pending = append(u.pending, b)
	u.stats.Enqueued++
	u.mu.Unlock()
	select {
	case u.notify <- struct{}{}:
	default:
	}
}

// Stats returns a snapshot of the self-metrics.
func (u *Uplink) Stats() Stats {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.stats
	s.Pending = len(u.pending)
	return s
}

// Flush waits until every enqueued batch is acked, or ctx ends.
func (u *Uplink) Flush(ctx context.Context) error {
	for {
		u.mu.Lock()
		empty := len(u.pending) == 0
		ch := u.drained
		u.mu.Unlock()
		if empty {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run keeps a stream open until ctx ends, reconnecting with jittered
// exponential backoff. It returns nil when ctx ends.
func (u *Uplink) Run(ctx context.Context) error {
	defer u.conn.Close()
	backoff := u.cfg.MinBackoff
	for ctx.Err() == nil {
		acked, err := u.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if acked {
			backoff = u.cfg.MinBackoff
		}
		u.cfg.Logger.Warn("uplink: collector stream ended, reconnecting", "collector", u.cfg.Address, "err", err, "retry_in", backoff)
		// Full jitter keeps a fleet of agents from reconnecting in lockstep
		// after a collector restart.
		delay := time.Duration(rand.Int64N(int64(backoff))) + backoff/2
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil
		}
		backoff = min(backoff*2, u.cfg.MaxBackoff)
	}
	return nil
}

// session runs one stream. It reports whether any batch was acked on it.
func (u *Uplink) session(parent context.Context) (acked bool, err error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	stream, err := pb.NewIngestServiceClient(u.conn).Stream(ctx)
	if err != nil {
		return false, err
	}
	if err := stream.Send(&pb.StreamRequest{Msg: &pb.StreamRequest_Hello{Hello: u.cfg.Hello}}); err != nil {
		return false, err
	}
	u.setConnected(true)
	defer u.setConnected(false)

	var (
		recvErr  = make(chan error, 1)
		gotAck   bool
		gotAckMu sync.Mutex
	)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch msg := m.Msg.(type) {
			case *pb.StreamResponse_Ack:
				u.remove(msg.Ack.Seq, false)
				gotAckMu.Lock()
				gotAck = true
				gotAckMu.Unlock()
			case *pb.StreamResponse_Reject:
				u.cfg.Logger.Error("uplink: collector rejected a batch; dropping it", "seq", msg.Reject.Seq, "reason", msg.Reject.Reason)
				u.remove(msg.Reject.Seq, true)
			case *pb.StreamResponse_Advisory:
				if u.cfg.OnAdvisory != nil {
					u.cfg.OnAdvisory(msg.Advisory)
				}
			}
		}
	}()
	defer func() {
		gotAckMu.Lock()
		acked = gotAck
		gotAckMu.Unlock()
	}()

	var sentUpTo uint64 // every pending batch with seq <= sentUpTo went out on this stream
	for {
		for _, b := range u.unsent(sentUpTo) {
			if err := stream.Send(&pb.StreamRequest{Msg: &pb.StreamRequest_Batch{Batch: b}}); err != nil {
				return false, err
			}
			sentUpTo = b.Seq
			u.mu.Lock()
			u.stats.Sent++
			u.mu.Unlock()
		}
		select {
		case <-u.notify:
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				err = errors.New("collector closed the stream")
			}
			return false, err
		case <-ctx.Done():
			_ = stream.CloseSend()
			return false, ctx.Err()
		}
	}
}

func (u *Uplink) unsent(after uint64) []*pb.Batch {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, b := range u.pending {
		if b.Seq > after {
			return append([]*pb.Batch(nil), u.pending[i:]...)
		}
	}
	return nil
}

func (u *Uplink) remove(seq uint64, rejected bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for i, b := range u.pending {
		if b.Seq == seq {
			u.pending = append(u.pending[:i], u.pending[i+1:]...)
			if rejected {
				u.stats.Rejected++
			} else {
				u.stats.Acked++
			}
			break
		}
	}
	if len(u.pending) == 0 {
		close(u.drained)
		u.drained = make(chan struct{})
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
