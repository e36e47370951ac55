// Package server wires the collector: the store, the ingest and query gRPC
// services, gRPC health and server reflection, on one listener.
//
// Lifecycle (OpenTelemetry Collector style): New validates nothing but keeps
// the config; Start opens the store, binds the listener and serves in the
// background, returning once the collector accepts connections; Shutdown ends
// agent streams, stops gRPC gracefully (hard stop if ctx expires first) and
// closes the store. Shutdown is safe to call more than once, and after a
// failed or missing Start.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/auth"
	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// MaxRecvMsgSize is the largest message the collector accepts.
const MaxRecvMsgSize = 16 << 20

// DefaultListen is the default listen address.
const DefaultListen = "127.0.0.1:7433"

// Config is the collector's configuration.
type Config struct {
	// Listen is the host:port to listen on (port 0 picks a free one).
	Listen string
	// DataDir is the badger directory.
	DataDir string
	// GPUPricePerHour is the default $/GPU-hour for runs whose run_start has
	// no price; 0 = unknown.
	GPUPricePerHour float64
	// EnergyPricePerKWh is the flat energy tariff; 0 = unknown.
	EnergyPricePerKWh float64
	// GridGCO2PerKWh is the grid carbon intensity; 0 = unknown.
	GridGCO2PerKWh float64
	// GCInterval is how often value-log GC runs; 0 disables it.
	GCInterval time.Duration
	// RawRetention, when positive, bounds how long raw records are kept
	// (store.Options.RawRetention); 0 keeps them forever. Run aggregates
	// are kept regardless.
	RawRetention time.Duration
	// StatusListen, when set (HOST:PORT), serves GET /healthz and GET /status
	// over plain HTTP (docs/observability.md).
	StatusListen string
	// Now is the clock for the batch time bounds (ingest.CheckBatchTime) and
	// last-seen times; time.Now if nil. Tests set it.
	Now func() time.Time

	// TLS: the server certificate and key, and optionally a client CA
	// bundle (mTLS: a client certificate signed by it is required). Files
	// are re-read when they change. Empty: plaintext.
	TLSCertFile, TLSKeyFile, TLSClientCAFile string
	// Token files (see package auth); empty: that check is off.
	IngestTokensFile, ReadTokenFile, AdminTokenFile string
}

// TLSOptions returns the TLS file settings.
func (c Config) TLSOptions() tlsfiles.ServerOptions {
	return tlsfiles.ServerOptions{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ClientCAFile: c.TLSClientCAFile}
}

// AuthConfig returns the token file settings.
func (c Config) AuthConfig() auth.Config {
	return auth.Config{IngestTokensFile: c.IngestTokensFile, ReadTokenFile: c.ReadTokenFile, AdminTokenFile: c.AdminTokenFile}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen address is empty"))
	} else if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen address %q: %v", c.Listen, err))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data directory is empty"))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"gpu price per hour", c.GPUPricePerHour}, {"energy price per kWh", c.EnergyPricePerKWh}, {"grid gCO2 per kWh", c.GridGCO2PerKWh}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be a finite number >= 0, got %v", f.name, f.v))
		}
	}
	if c.GCInterval < 0 {
		errs = append(errs, fmt.Errorf("gc interval must be >= 0, got %v", c.GCInterval))
	}
	if c.RawRetention < 0 {
		errs = append(errs, fmt.Errorf("raw retention must be >= 0, got %v", c.RawRetention))
	}
	if err := c.TLSOptions().Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Pricing returns the cost settings for reports.
func (c Config) Pricing() aggregate.Pricing {
	return aggregate.Pricing{GPUPricePerHour: c.GPUPricePerHour, EnergyPricePerKWh: c.EnergyPricePerKWh, GridGCO2PerKWh: c.GridGCO2PerKWh}
}

// storeOptions: with a raw retention, dedup marks are kept a day longer than
// the oldest batch ingest accepts, so no replay can be applied twice.
func (s *Server) storeOptions() store.Options {
	o := store.Options{Logger: s.log, RawRetention: s.cfg.RawRetention}
	if s.cfg.RawRetention > 0 {
		o.DedupRetention = ingest.MaxBatchAge + 24*time.Hour
	}
	return o
}

// Server is a collector.
type Server struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	started bool
	store   *store.Store
	ingest  *ingest.Server
	grpc    *grpc.Server
	health  *health.Server
	lis     net.Listener
	served  chan struct{}
	stopped bool

	// Self-observability (status.go).
	startedAt   time.Time
	statusLn    net.Listener
	statusSrv   *http.Server
	summaryStop chan struct{}
}

// New returns a collector with cfg. log may be nil.
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, log: log}
}

// Start validates the config, opens the store, listens and serves.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("collector already started")
	}
	if err := s.cfg.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	st, err := store.Open(s.cfg.DataDir, s.storeOptions())
	if err != nil {
		return err
	}
	opts, err := s.securityOptions()
	if err != nil {
		st.Close()
		return err
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		st.Close()
		return fmt.Errorf("listen on %s: %w", s.cfg.Listen, err)
	}
	st.StartGC(s.cfg.GCInterval)

	ing := ingest.New(st, s.log)
	ing.SetClock(s.cfg.Now)
	qs := query.New(st, ing, s.cfg.Pricing())
	gs := grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, opts...)...)
	trainmeterv1.RegisterIngestServiceServer(gs, ing)
	trainmeterv1.RegisterQueryServiceServer(gs, qs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	for _, name := range []string{"", trainmeterv1.IngestService_ServiceDesc.ServiceName, trainmeterv1.QueryService_ServiceDesc.ServiceName} {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	reflection.Register(gs)

	if err := s.startStatus(); err != nil {
		lis.Close()
		st.Close()
		return err
	}
	s.summaryStop = make(chan struct{})
	go s.logSummary(time.Minute, s.summaryStop)
	s.store, s.ingest, s.grpc, s.health, s.lis = st, ing, gs, hs, lis
	s.served = make(chan struct{})
	s.started = true
	go func() {
		defer close(s.served)
		if err := gs.Serve(lis); err != nil {
			s.log.Error("grpc serve", "err", err)
		}
	}()
	s.log.Info("listening on "+lis.Addr().String(), "addr", lis.Addr().String(), "data", s.cfg.DataDir,
		"tls", s.cfg.TLSOptions().Enabled(), "mtls", s.cfg.TLSClientCAFile != "", "tokens", s.cfg.AuthConfig().Enabled())
	if !s.cfg.TLSOptions().Enabled() && !isLoopback(lis.Addr()) {
		s.log.Warn("serving plaintext gRPC on a non-loopback address: data (and tokens) travel unencrypted; set --tls-cert and --tls-key", "addr", lis.Addr().String())
	}
	return nil
}

// securityOptions builds the TLS credentials and the token interceptors.
func (s *Server) securityOptions() ([]grpc.ServerOption, error) {
	var opts []grpc.ServerOption
	if s.cfg.TLSOptions().Enabled() {
		creds, err := tlsfiles.ServerCredentials(s.cfg.TLSOptions(), s.log)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	if s.cfg.AuthConfig().Enabled() {
		a, err := auth.New(s.cfg.AuthConfig(), s.log)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor()))
	}
	return opts, nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// Addr returns the bound listen address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// Ingest returns the ingest server (for advisories), nil before Start.
func (s *Server) Ingest() *ingest.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ingest
}

// Shutdown stops the collector: agent streams end with Unavailable (they
// reconnect and resend unacked batches), in-flight calls finish unless ctx
// expires first, then the store is closed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.stopped {
		return nil
	}
	s.stopped = true
	s.health.Shutdown()
	s.ingest.Close()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("graceful stop timed out; stopping hard")
		s.grpc.Stop()
		<-done
	}
	<-s.served
	close(s.summaryStop)
	s.stopStatus()
	if err := s.store.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	s.log.Info("collector stopped")
	return nil
}
