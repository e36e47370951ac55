package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Group streams the batches to several collectors. In mode all (a pair,
// usually) every batch goes to each: one Uplink per collector, each on its
// own cursor of the shared spool. A batch is written to the spool once and
// stays there until every collector has acked it. Each uplink reconnects on
// its own schedule, so a collector that is down holds up neither the other
// nor Enqueue. In mode any (replicas on one database) each batch goes to
// one of them: one Uplink on the spool's one cursor, moving to the next
// collector when the one in use fails.
type Group struct {
	spool *spool.Spool
	ups   []*Uplink
	log   *slog.Logger
}

// DefaultAckTimeout is how long, in mode any, a sent batch waits for its ack
// before the collector counts as failed: far above a healthy collector's
// commit (milliseconds), short enough that a hung one costs little.
const DefaultAckTimeout = 15 * time.Second

// NewGroup builds the uplinks over sp. In mode all (anyOne false) one per
// address, and sp's cursors must be the addresses in the same order; in mode
// any one for the list, starting with addrs[0], and sp has one cursor. base is each uplink's Config
// apart from Address, Alternates and Cursor (mode any sets AckTimeout to
// DefaultAckTimeout when it is 0); onAdvisory, when set, gets each advisory
// with the index in addrs of the collector that sent it.
func NewGroup(sp *spool.Spool, addrs []string, anyOne bool, base Config, onAdvisory func(collector int, adv *trainmeterv1.Advisory)) (*Group, error) {
	if len(addrs) == 0 {
		return nil, errors.New("uplink: no collector address")
	}
	if sp == nil {
		return nil, errors.New("uplink: no spool")
	}
	if anyOne {
		return newAnyGroup(sp, addrs, base, onAdvisory)
	}
	if sp.Cursors() != len(addrs) {
		return nil, fmt.Errorf("uplink: %d collectors but the spool has %d cursors", len(addrs), sp.Cursors())
	}
	base.Logger = cmp.Or(base.Logger, slog.New(slog.DiscardHandler))
	g := &Group{spool: sp, log: base.Logger}
	for i, addr := range addrs {
		cfg := base
		cfg.Address, cfg.Spool, cfg.Cursor = addr, sp, i
		if onAdvisory != nil {
			cfg.OnAdvisory = func(adv *trainmeterv1.Advisory) { onAdvisory(i, adv) }
		}
		if len(addrs) > 1 {
			cfg.Logger = cfg.Logger.With("collector", addr)
		}
		u, err := New(cfg)
		if err != nil {
			for _, prev := range g.ups {
				_ = prev.Shutdown(context.Background())
			}
			return nil, err
		}
		g.ups = append(g.ups, u)
	}
	return g, nil
}

// newAnyGroup is mode any: one uplink on cursor 0 over the list, starting
// with its first collector. An advisory comes with the index in addrs of the
// collector in use, so that the same decision sent again by the next
// replica after a move is known as a repeat (as a pair's is).
func newAnyGroup(sp *spool.Spool, addrs []string, base Config, onAdvisory func(int, *trainmeterv1.Advisory)) (*Group, error) {
	if sp.Cursors() != 1 {
		return nil, fmt.Errorf("uplink: mode any streams on one spool cursor, but the spool has %d", sp.Cursors())
	}
	cfg := base
	cfg.Spool, cfg.Cursor = sp, 0
	cfg.Address, cfg.Alternates = addrs[0], addrs[1:]
	cfg.AckTimeout = cmp.Or(cfg.AckTimeout, DefaultAckTimeout)
	var u *Uplink
	if onAdvisory != nil {
		cfg.OnAdvisory = func(adv *trainmeterv1.Advisory) { onAdvisory(u.inUse(), adv) }
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	u, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Group{spool: sp, ups: []*Uplink{u}, log: cfg.Logger}, nil
}

// Uplinks are the group's uplinks, in the collectors' order.
func (g *Group) Uplinks() []*Uplink { return g.ups }

// Enqueue writes the batch to the spool once and wakes every uplink. It
// never waits for the network.
func (g *Group) Enqueue(b *trainmeterv1.Batch) {
	if err := g.spool.Append(b); err != nil {
		g.log.Error("uplink: batch not spooled", "err", err)
	}
	for _, u := range g.ups {
		u.enqueued()
	}
}

// Stats sums the uplinks' counters over the collectors (Sent, Acked,
// Rejected, Connects); Enqueued counts batches handed over once; Pending is
// what the spool holds until every collector has acked it; Connected is
// whether every collector is. With one collector they are its own.
func (g *Group) Stats() Stats {
	s := g.ups[0].Stats()
	for _, u := range g.ups[1:] {
		us := u.Stats()
		s.Sent += us.Sent
		s.Acked += us.Acked
		s.Rejected += us.Rejected
		s.Connects += us.Connects
		s.Connected = s.Connected && us.Connected
	}
	if len(g.ups) > 1 {
		s.Pending = g.spool.Len()
	}
	return s
}

// Start starts every uplink.
func (g *Group) Start(ctx context.Context) error {
	for _, u := range g.ups {
		if err := u.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Flush waits until every collector has acked every spooled batch, or ctx
// ends; the uplinks flush side by side, so one that is down costs no more
// than ctx.
func (g *Group) Flush(ctx context.Context) error {
	return g.each(func(u *Uplink) error {
		if err := u.Flush(ctx); err != nil {
			return fmt.Errorf("collector %s: %d batches not acked: %w", u.Address(), u.cur.Len(), err)
		}
		return nil
	})
}

// Shutdown stops every uplink; what is not acked stays in the spool.
func (g *Group) Shutdown(ctx context.Context) error {
	return g.each(func(u *Uplink) error { return u.Shutdown(ctx) })
}

func (g *Group) each(fn func(*Uplink) error) error {
	errs := make([]error, len(g.ups))
	var wg sync.WaitGroup
	for i, u := range g.ups {
		wg.Go(func() { errs[i] = fn(u) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
