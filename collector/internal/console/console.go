// Package console is the collector's web console (`trainmeter serve
// --ui-listen`): server-rendered pages (html/template) of runs, a run's
// timeline, comparisons, budgets, prices, recommendations and nodes, with
// a little JavaScript for the charts (uPlot, vendored) and live updates
// (short polling). docs/console.md describes every page.
//
// The console computes nothing itself: every figure comes from the
// collector's own gRPC services, called through their Go API, so a page
// shows what `trainmeter report --json` and `compare --json` print.
//
// Security: a strict Content-Security-Policy (scripts and styles only from
// the console's own embedded files, no inline script), every trainer-
// supplied value escaped by html/template or set as text by the scripts,
// JSON for the scripts served by data endpoints (never interpolated into a
// script), and the query API's TLS and read-token rules (package auth).
package console

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/auth"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// DefaultListen is the console's default address: next to the query API's
// 127.0.0.1:7433, on loopback only.
const DefaultListen = "127.0.0.1:7434"

// Services are the collector's gRPC services the pages read, called in
// process.
type Services struct {
	Query     trainmeterv1.QueryServiceServer
	Budgets   trainmeterv1.BudgetServiceServer
	Prices    trainmeterv1.PriceServiceServer
	Recommend trainmeterv1.RecommendServiceServer
}

// Config configures the console.
type Config struct {
	// Listen is HOST:PORT (port 0 picks one).
	Listen string
	// TLS, when enabled, serves HTTPS with the query API's certificate.
	TLS tlsfiles.ServerOptions
	// Auth checks tokens as the query API does; nil: no tokens configured.
	Auth *auth.Auth
	// Services the pages read.
	Services Services
	// Clock is the clock for "last seen", sparkline windows, usage periods
	// and the failed-login limit; the wall clock if nil.
	Clock clock.Clock
}

var _ lifecycle.Component = (*Console)(nil)

// Console serves the web console; a lifecycle.Component.
type Console struct {
	cfg    Config
	log    *slog.Logger
	h      http.Handler
	logins *loginLimiter

	mu      sync.Mutex
	lis     net.Listener
	srv     *http.Server
	served  chan struct{}
	started bool
	stopped bool
}

// New returns a console; nil log discards.
func New(cfg Config, log *slog.Logger) (*Console, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	s := cfg.Services
	if s.Query == nil || s.Budgets == nil || s.Prices == nil || s.Recommend == nil {
		return nil, errors.New("console: every service is needed")
	}
	c := &Console{cfg: cfg, log: log, logins: newLoginLimiter(cfg.Clock)}
	h, err := c.routes()
	if err != nil {
		return nil, err
	}
	c.h = h
	return c, nil
}

// Handler is the console's HTTP handler (headers, auth and pages), for
// tests and benchmarks that do not need a listener.
func (c *Console) Handler() http.Handler { return c.h }

// Start binds the listener and serves in the background.
func (c *Console) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("console already started")
	}
	var tlsCfg *tls.Config
	if c.cfg.TLS.Enabled() {
		var err error
		if tlsCfg, err = tlsfiles.ServerConfig(c.cfg.TLS, c.log); err != nil {
			return fmt.Errorf("console tls: %w", err)
		}
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", c.cfg.Listen)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w", c.cfg.Listen, err)
	}
	srv := &http.Server{
		Handler:           c.h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
	}
	if tlsCfg != nil {
		lis = tls.NewListener(lis, tlsCfg)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("console serve", "err", err)
		}
	}()
	c.lis, c.srv, c.served, c.started = lis, srv, served, true
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	c.log.Info("web console on "+scheme+"://"+lis.Addr().String()+"/", "addr", lis.Addr().String(), "tls", tlsCfg != nil, "tokens", c.cfg.Auth.QueryTokens())
	if tlsCfg == nil && !tlsfiles.IsLoopback(lis.Addr().String()) {
		c.log.Warn("serving the web console over plain HTTP on a non-loopback address: pages (and tokens) travel unencrypted; set --tls-cert and --tls-key", "addr", lis.Addr().String())
	}
	return nil
}

// Addr is the bound address, nil before Start.
func (c *Console) Addr() net.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lis == nil {
		return nil
	}
	return c.lis.Addr()
}

// Shutdown stops serving; requests in flight finish unless ctx ends first.
func (c *Console) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started || c.stopped {
		return nil
	}
	c.stopped = true
	err := c.srv.Shutdown(ctx)
	if err != nil {
		_ = c.srv.Close()
	}
	<-c.served
	return err
}
