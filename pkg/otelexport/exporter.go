package otelexport

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	otellog "go.opentelemetry.io/otel/log"
	lognoop "go.opentelemetry.io/otel/log/noop"
	"go.opentelemetry.io/otel/metric"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc/credentials"
)

// ScopeName is the instrumentation scope of everything trainmeter exports.
const ScopeName = "github.com/trainmeter/trainmeter"

// Resource identifies the exporting process (OTel resource attributes).
type Resource struct {
	ServiceName    string // service.name: trainmeter-collector or trainmeter-agent
	ServiceVersion string // service.version
	// InstanceID is service.instance.id; stable across restarts of the same
	// instance so that its series do not multiply.
	InstanceID string
	HostName   string // host.name; os.Hostname() when empty
}

func (r Resource) attributes() []attribute.KeyValue {
	host := r.HostName
	if host == "" {
		host, _ = os.Hostname()
	}
	attrs := []attribute.KeyValue{
		attribute.String("service.name", r.ServiceName),
		attribute.String("service.instance.id", r.InstanceID),
		attribute.String("host.name", host),
	}
	if r.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", r.ServiceVersion))
	}
	return attrs
}

// resource is the OTel resource: r's attributes, then those of the standard
// environment variables OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME,
// which add attributes and win over r's for the same key (the operator's
// explicit setting). A malformed OTEL_RESOURCE_ATTRIBUTES is an error.
func (r Resource) resource(ctx context.Context) (*resource.Resource, error) {
	rsc, err := resource.New(ctx, resource.WithAttributes(r.attributes()...), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("otel resource from OTEL_RESOURCE_ATTRIBUTES/OTEL_SERVICE_NAME: %w", err)
	}
	return rsc, nil
}

// Exporter owns the SDK providers and the Prometheus endpoint.
type Exporter struct {
	meters *sdkmetric.MeterProvider
	logs   *sdklog.LoggerProvider // nil without OTLP: alert records go nowhere

	promLn  net.Listener
	promSrv *http.Server
	served  chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error
}

// errorHandlerOnce installs one SDK error handler per process (the SDK's is
// global): export failures are logged, not printed by the SDK's default.
var errorHandlerOnce sync.Once

// Start builds the providers for cfg (which must be Enabled and valid) and
// starts the Prometheus endpoint when configured. A nil log discards its logs.
func Start(ctx context.Context, cfg Config, res Resource, log *slog.Logger) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, errors.New("otel export: neither an OTLP endpoint nor a Prometheus listen address is set")
	}
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	errorHandlerOnce.Do(func() {
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("otel export failed", "err", err) }))
	})
	rsc, err := res.resource(ctx)
	if err != nil {
		return nil, err
	}
	e := &Exporter{}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(rsc)}
	var lopts []sdklog.LoggerProviderOption

	if cfg.PrometheusListen != "" {
		reg := prometheus.NewRegistry()
		pexp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(pexp))
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", cfg.PrometheusListen)
		if err != nil {
			return nil, fmt.Errorf("prometheus listen on %s: %w", cfg.PrometheusListen, err)
		}
		mux := http.NewServeMux()
		serve := func(g prometheus.Gatherer) http.Handler {
			return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
		}
		if cfg.PrometheusGate != nil {
			mux.Handle("GET /metrics", cfg.PrometheusGate.handler(reg, serve))
		} else {
			mux.Handle("GET /metrics", serve(reg))
		}
		e.promLn = ln
		e.promSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		e.served = make(chan struct{})
	}
	// OTLP last: nothing above can fail after its exporters (and their
	// connections) exist.
	if cfg.Endpoint != "" {
		// The headers file's headers join Headers (Validate read it).
		cfg.Headers, err = cfg.AllHeaders()
		var tlsCfg *tls.Config
		if err == nil {
			tlsCfg, err = cfg.tlsConfig()
		}
		var mexp sdkmetric.Exporter
		var lexp sdklog.Exporter
		if err == nil {
			mexp, lexp, err = cfg.otlpExporters(ctx, tlsCfg)
		}
		if err != nil {
			if e.promLn != nil {
				e.promLn.Close()
			}
			return nil, err
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(cfg.interval()))))
		lopts = append(lopts, sdklog.WithResource(rsc), sdklog.WithProcessor(sdklog.NewBatchProcessor(lexp, sdklog.WithExportInterval(time.Second))))
	}
	if e.promSrv != nil {
		go func() {
			defer close(e.served)
			if err := e.promSrv.Serve(e.promLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("prometheus endpoint", "err", err)
			}
		}()
	}
	e.meters = sdkmetric.NewMeterProvider(mopts...)
	if lopts != nil {
		e.logs = sdklog.NewLoggerProvider(lopts...)
	}
	log.Info("otel export on", "otlp_endpoint", cfg.Endpoint, "otlp_protocol", cfg.protocol(), "otlp_interval", cfg.interval(),
		"prometheus", e.PrometheusAddr())
	return e, nil
}

func (c Config) tlsConfig() (*tls.Config, error) {
	if c.Insecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("otlp CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("otlp CA file %s: no PEM certificate in it", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// otlpExporters builds the metric and log exporters; they connect lazily,
// so an unreachable receiver does not stop the process from starting.
func (c Config) otlpExporters(ctx context.Context, tlsCfg *tls.Config) (sdkmetric.Exporter, sdklog.Exporter, error) {
	if c.protocol() == ProtocolHTTP {
		mo := []otlpmetrichttp.Option{otlpmetrichttp.WithEndpoint(c.Endpoint), otlpmetrichttp.WithHeaders(c.Headers)}
		lo := []otlploghttp.Option{otlploghttp.WithEndpoint(c.Endpoint), otlploghttp.WithHeaders(c.Headers)}
		if tlsCfg == nil {
			mo, lo = append(mo, otlpmetrichttp.WithInsecure()), append(lo, otlploghttp.WithInsecure())
		} else {
			mo, lo = append(mo, otlpmetrichttp.WithTLSClientConfig(tlsCfg)), append(lo, otlploghttp.WithTLSClientConfig(tlsCfg))
		}
		m, err := otlpmetrichttp.New(ctx, mo...)
		if err != nil {
			return nil, nil, fmt.Errorf("otlp/http metric exporter: %w", err)
		}
		l, err := otlploghttp.New(ctx, lo...)
		if err != nil {
			_ = m.Shutdown(ctx)
			return nil, nil, fmt.Errorf("otlp/http log exporter: %w", err)
		}
		return m, l, nil
	}
	mo := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(c.Endpoint), otlpmetricgrpc.WithHeaders(c.Headers)}
	lo := []otlploggrpc.Option{otlploggrpc.WithEndpoint(c.Endpoint), otlploggrpc.WithHeaders(c.Headers)}
	if tlsCfg == nil {
		mo, lo = append(mo, otlpmetricgrpc.WithInsecure()), append(lo, otlploggrpc.WithInsecure())
	} else {
		creds := credentials.NewTLS(tlsCfg)
		mo, lo = append(mo, otlpmetricgrpc.WithTLSCredentials(creds)), append(lo, otlploggrpc.WithTLSCredentials(creds))
	}
	m, err := otlpmetricgrpc.New(ctx, mo...)
	if err != nil {
		return nil, nil, fmt.Errorf("otlp/grpc metric exporter: %w", err)
	}
	l, err := otlploggrpc.New(ctx, lo...)
	if err != nil {
		_ = m.Shutdown(ctx)
		return nil, nil, fmt.Errorf("otlp/grpc log exporter: %w", err)
	}
	return m, l, nil
}

// Meter returns trainmeter's meter.
func (e *Exporter) Meter() metric.Meter { return e.meters.Meter(ScopeName) }

// Logger returns trainmeter's logger (a no-op one without OTLP).
func (e *Exporter) Logger() otellog.Logger {
	if e.logs == nil {
		return lognoop.NewLoggerProvider().Logger(ScopeName)
	}
	return e.logs.Logger(ScopeName)
}

// PrometheusAddr is the bound /metrics address, nil when off.
func (e *Exporter) PrometheusAddr() net.Addr {
	if e.promLn == nil {
		return nil
	}
	return e.promLn.Addr()
}

// Flush exports what is pending now (OTLP only; Prometheus is pulled).
func (e *Exporter) Flush(ctx context.Context) error {
	err := e.meters.ForceFlush(ctx)
	if e.logs != nil {
		err = errors.Join(err, e.logs.ForceFlush(ctx))
	}
	return err
}

// Shutdown pushes a last export, then stops the providers and the
// Prometheus endpoint. Safe to call more than once.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.shutdownOnce.Do(func() {
		var errs []error
		if err := e.meters.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("metrics: %w", err))
		}
		if e.logs != nil {
			if err := e.logs.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("logs: %w", err))
			}
		}
		if e.promSrv != nil {
			if err := e.promSrv.Shutdown(ctx); err != nil {
				_ = e.promSrv.Close()
			}
			<-e.served
		}
		e.shutdownErr = errors.Join(errs...)
	})
	return e.shutdownErr
}
