package doctor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/internal/buildinfo"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func checkCollector(ctx context.Context, o Options, r *Report) {
	cfg := o.Config
	host, _, err := net.SplitHostPort(cfg.Collector)
	if err != nil {
		r.add(SectionCollector, "address", Fail, fmt.Sprintf("collector %q: %v", cfg.Collector, err), "give --collector HOST:PORT (default port 7433)")
		return
	}
	discard := slog.New(slog.DiscardHandler)

	// Resolve.
	if net.ParseIP(host) != nil {
		r.add(SectionCollector, "address", OK, cfg.Collector+" (an IP address: nothing to resolve)", "")
	} else {
		rctx, cancel := context.WithTimeout(ctx, o.Timeout)
		addrs, err := net.DefaultResolver.LookupHost(rctx, host)
		cancel()
		if err != nil {
			r.add(SectionCollector, "address", Fail, fmt.Sprintf("cannot resolve %s: %v", host, err), "check the host name in --collector (collector:) and this machine's DNS")
			return
		}
		r.add(SectionCollector, "address", OK, fmt.Sprintf("%s resolves to %s", host, strings.Join(addrs, ", ")), "")
	}

	// Reach (TCP).
	d := net.Dialer{Timeout: o.Timeout}
	start := time.Now()
	raw, err := d.DialContext(ctx, "tcp", cfg.Collector)
	if err != nil {
		hint := "is `trainmeter serve` running there, listening on an address this machine can reach (--listen 0.0.0.0:7433, not 127.0.0.1)? Is a firewall in the way?"
		if tlsfiles.IsLoopback(cfg.Collector) {
			hint = "is `trainmeter serve` running on this machine, with --listen on this port? (--collector HOST:PORT points the agent at a collector elsewhere)"
		}
		r.add(SectionCollector, "reach", Fail, fmt.Sprintf("cannot connect to %s: %v", cfg.Collector, err), hint)
		return
	}
	r.add(SectionCollector, "reach", OK, fmt.Sprintf("TCP connection to %s in %v", raw.RemoteAddr(), time.Since(start).Round(time.Microsecond)), "")

	// TLS.
	creds := insecure.NewCredentials()
	if cfg.TLSOptions().Enabled() {
		c, err := tlsfiles.ClientCredentials(cfg.TLSOptions(), discard)
		if err != nil {
			raw.Close()
			r.add(SectionCollector, "tls", Fail, "TLS files: "+err.Error(), "--tls-ca, --tls-cert and --tls-key must be readable PEM files")
			return
		}
		creds = c
		hctx, cancel := context.WithTimeout(ctx, o.Timeout)
		conn, info, err := c.ClientHandshake(hctx, cfg.Collector, raw)
		cancel()
		if err != nil {
			raw.Close()
			r.add(SectionCollector, "tls", Fail, "TLS handshake failed: "+err.Error(), connHint(err, true))
			return
		}
		msg := "TLS handshake OK"
		if ti, ok := info.(credentials.TLSInfo); ok {
			msg = fmt.Sprintf("TLS handshake OK (%s", tls.VersionName(ti.State.Version))
			if len(ti.State.PeerCertificates) > 0 {
				c := ti.State.PeerCertificates[0]
				msg += fmt.Sprintf(", server certificate %q issued by %q, valid until %s", c.Subject.CommonName, c.Issuer.CommonName, c.NotAfter.Format("2006-01-02"))
			}
			msg += ")"
		}
		if cfg.TLSCert != "" {
			msg += "; client certificate " + cfg.TLSCert + " presented (mTLS)"
		}
		conn.Close()
		r.add(SectionCollector, "tls", OK, msg, "")
	} else {
		raw.Close()
		if tlsfiles.IsLoopback(cfg.Collector) {
			r.add(SectionCollector, "tls", OK, "plaintext to a collector on this machine (no TLS configured)", "")
		} else {
			r.add(SectionCollector, "tls", Warn, "plaintext: batches (and a token, were one set) would cross the network unencrypted",
				"serve the collector with --tls-cert/--tls-key and give the agent --tls-ca (docs/security.md)")
		}
	}

	conn, err := grpc.NewClient(cfg.Collector, grpc.WithTransportCredentials(creds))
	if err != nil {
		r.add(SectionCollector, "health", Fail, err.Error(), "")
		return
	}
	defer conn.Close()

	// Health.
	hctx, cancel := context.WithTimeout(ctx, o.Timeout)
	resp, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{})
	cancel()
	switch {
	case status.Code(err) == codes.Unimplemented:
		r.add(SectionCollector, "health", Warn, "no gRPC health service answers: is this a trainmeter collector?", "")
	case err != nil:
		r.add(SectionCollector, "health", Fail, "gRPC health check failed: "+status.Convert(err).Message(), connHint(err, cfg.TLSOptions().Enabled()))
		return
	case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING:
		r.add(SectionCollector, "health", Fail, "the collector says "+resp.GetStatus().String(), "it is shutting down or not ready; see its log")
	default:
		r.add(SectionCollector, "health", OK, "the collector answers SERVING", "")
	}

	checkToken(ctx, o, r, creds, discard)
}

// checkToken opens the ingest stream with this node's token and a Hello for
// this node whose boot id is empty: the collector checks the token (stream
// open) and that the Hello names the token's node, then refuses the empty
// boot id with InvalidArgument before it stores or registers anything. That
// answer proves the token works, without leaving a trace of the probe.
func checkToken(ctx context.Context, o Options, r *Report, creds credentials.TransportCredentials, log *slog.Logger) {
	cfg := o.Config
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if cfg.TokenFile != "" {
		tok, err := tlsfiles.TokenFromFile(cfg.TokenFile, !cfg.TLSOptions().Enabled() && tlsfiles.IsLoopback(cfg.Collector), log)
		if err != nil {
			r.add(SectionCollector, "token", Fail, "cannot read the token file: "+err.Error(),
				"the file must exist and be readable by the agent's user (mode 0640, group trainmeter), with the token on one line")
			return
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tok))
	}
	conn, err := grpc.NewClient(cfg.Collector, opts...)
	if err != nil {
		r.add(SectionCollector, "token", Fail, err.Error(), "")
		return
	}
	defer conn.Close()
	sctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	err = probeStream(sctx, conn, cfg.Node)

	node := fmt.Sprintf("node %q", cfg.Node)
	code, msg := status.Code(err), status.Convert(err).Message()
	switch {
	case err == nil || (code == codes.InvalidArgument && strings.Contains(msg, "boot_id")):
		if cfg.TokenFile != "" {
			r.add(SectionCollector, "token", OK, fmt.Sprintf("the collector accepts this token for %s", node), "")
		} else {
			r.add(SectionCollector, "token", OK, fmt.Sprintf("the collector accepts batches from %s without a token", node), "")
		}
	case strings.Contains(msg, "insecure connection") || strings.Contains(msg, "transport level security"):
		r.add(SectionCollector, "token", Fail, "the token is not sent over plaintext to another machine: "+msg,
			"turn TLS on (--tls-ca) for a collector that is not on this machine (docs/security.md)")
	case code == codes.Unauthenticated && cfg.TokenFile == "":
		r.add(SectionCollector, "token", Fail, "the collector needs an ingest token: "+msg,
			fmt.Sprintf("put this node's token (its entry %q in the collector's --ingest-tokens file) in a file and pass --token-file FILE (token_file:)", cfg.Node))
	case code == codes.Unauthenticated:
		r.add(SectionCollector, "token", Fail, "the collector refused the token in "+cfg.TokenFile+": "+msg,
			fmt.Sprintf("the token is not in the collector's --ingest-tokens file (wrong token, or rotated): compare it with the entry for %q there", cfg.Node))
	case code == codes.PermissionDenied:
		r.add(SectionCollector, "token", Fail, "the token belongs to another node: "+msg,
			"--node (default: the hostname) must be the name this token has in the collector's --ingest-tokens file")
	default:
		r.add(SectionCollector, "token", Fail, fmt.Sprintf("ingest stream failed (%v): %s", code, msg), connHint(err, cfg.TLSOptions().Enabled()))
	}
}

// probeStream sends the token-checking Hello and returns how the stream ended
// (nil: ended without an error).
func probeStream(ctx context.Context, conn *grpc.ClientConn, node string) error {
	stream, err := trainmeterv1.NewIngestServiceClient(conn).Stream(ctx)
	if err != nil {
		return err
	}
	hello := &trainmeterv1.Hello{Node: node, AgentVersion: buildinfo.Version(), GpuBackend: "doctor"} // BootId deliberately empty
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_ = stream.CloseSend()
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// connHint guesses the usual cause of a failed TLS or gRPC connection.
func connHint(err error, tlsOn bool) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "unknown authority"):
		return "--tls-ca is not the CA that signed the collector's certificate"
	case strings.Contains(s, "certificate is valid for") || strings.Contains(s, "not valid for any names"):
		return "the collector's certificate does not name the host in --collector: connect by a name it has, or set --tls-server-name"
	case strings.Contains(s, "expired") || strings.Contains(s, "not yet valid"):
		return "a certificate is outside its validity period (check both certificates and this machine's clock)"
	case strings.Contains(s, "first record does not look like a TLS handshake"):
		return "the collector speaks plaintext: drop --tls-ca/--tls-cert, or start it with --tls-cert/--tls-key"
	case strings.Contains(s, "certificate required") || strings.Contains(s, "bad certificate"):
		return "the collector requires a client certificate (mTLS): give --tls-cert/--tls-key signed by its --tls-client-ca"
	case !tlsOn && (strings.Contains(s, "EOF") || strings.Contains(s, "connection reset") || strings.Contains(s, "server preface")):
		return "if the collector serves TLS, give the agent --tls-ca (docs/security.md)"
	}
	return ""
}

// checkAnyCollector checks each collector of mode any on its own, in the
// order the agent tries them. The agent needs only one: a collector that
// fails its checks is a WARN while another passes them, a FAIL when none does.
func checkAnyCollector(ctx context.Context, o Options, r *Report) {
	order := o.Config.AnyOrder()
	r.add(SectionCollector, "mode", OK, fmt.Sprintf("any: each batch goes to one of %d collectors, the next when one fails; the agent starts with %s",
		len(order), order[0]), "")
	var checks []Check
	up := 0
	for _, addr := range order {
		one := o
		one.Config.Collector = addr
		each := &Report{OK: true}
		checkCollector(ctx, one, each)
		if each.OK {
			up++
		}
		checks = append(checks, each.Checks...)
	}
	for _, c := range checks {
		if c.Status == Fail && up > 0 {
			c.Status = Warn
			c.Hint = strings.TrimSpace(c.Hint + " (meanwhile the agent uses the collectors that pass)")
		}
		r.add(c.Section, c.Name, c.Status, c.Message, c.Hint)
	}
}
