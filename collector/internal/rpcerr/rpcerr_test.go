package rpcerr

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// failingHealth answers every Check with err.
type failingHealth struct {
	healthpb.UnimplementedHealthServer
	err error
}

func (f failingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return nil, f.err
}

// call makes one unary call to a real server on loopback answering err, and
// returns the client's status.
func call(t *testing.T, err error) *status.Status {
	t.Helper()
	lis, lerr := net.Listen("tcp", "127.0.0.1:0")
	if lerr != nil {
		t.Fatal(lerr)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, failingHealth{err: err})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, cerr := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if cerr != nil {
		t.Fatal(cerr)
	}
	defer conn.Close()
	_, cerr = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	return status.Convert(cerr)
}

func TestUpstreamUnavailableIsToldFromAnUnreachableCollector(t *testing.T) {
	st := call(t, UpstreamUnavailable("price fetch from vastai: HTTP 500"))
	if st.Code() != codes.Unavailable || st.Message() != "price fetch from vastai: HTTP 500" || !FromUpstream(st) {
		t.Errorf("upstream failure arrived as %v %q, marked %v; want Unavailable, the message, marked", st.Code(), st.Message(), FromUpstream(st))
	}
	if plain := call(t, status.Error(codes.Unavailable, "collector is shutting down")); FromUpstream(plain) {
		t.Error("a plain Unavailable is marked as an upstream failure")
	}
	// Nothing listens: the transport's own Unavailable.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if st := status.Convert(err); st.Code() != codes.Unavailable || FromUpstream(st) {
		t.Errorf("unreachable collector: %v, marked %v; want Unavailable, unmarked", st.Code(), FromUpstream(st))
	}
}
