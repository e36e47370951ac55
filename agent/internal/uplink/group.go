package uplink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Group streams every batch to each of several collectors (a pair, usually):
// one Uplink per collector, each on its own cursor of the shared spool. A
// batch is written to the spool once and stays there until every collector
// has acked it. Each uplink reconnects on its own schedule, so a collector
// that is down holds up neither the other nor Enqueue.
type Group struct {
	spool *spool.Spool
	ups   []*Uplink
	log   *slog.Logger
}

// NewGroup builds one uplink per address over sp, whose cursors must be the
// addresses in the same order. base is each uplink's Config apart from
// Address and Cursor; onAdvisory, when set, gets each advisory with the
// index of the collector that sent it.
func NewGroup(sp *spool.Spool, addrs []string, base Config, onAdvisory func(collector int, adv *trainmeterv1.Advisory)) (*Group, error) {
	if len(addrs) == 0 {
		return nil, errors.New("uplink: no collector address")
	}
	if sp == nil {
		return nil, errors.New("uplink: no spool")
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
			return fmt.Errorf("collector %s: %d batches not acked: %w", u.cfg.Address, u.cur.Len(), err)
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
