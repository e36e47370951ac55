// Package flowcontrol holds the HTTP/2 flow-control windows the agent's
// uplink, the collector and the load generator use for gRPC.
//
// gRPC's default windows are dynamic: it estimates the bandwidth-delay
// product with a PING each time it receives data and no estimate is under
// way, and replenishes the connection's window every 16 KiB. An agent
// sends one small batch a second and gets one small ack back, so each was
// followed by a PING and its answer and a window update: three frames and
// two more wakeups of each process where one frame is needed
// (docs/benchmarks.md, appendix, "Third round"). Fixed windows turn the estimation off.
package flowcontrol

import "google.golang.org/grpc"

const (
	// StreamWindow is HTTP/2's default stream window: what one stream may
	// have in flight unread. Setting it (to at least this) is what turns
	// the estimation off.
	StreamWindow = 64<<10 - 1
	// ConnWindow is a connection's: larger, so that it is replenished
	// every 256 KiB rather than every 16 KiB.
	ConnWindow = 1 << 20
)

// ServerOptions are the collector's.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(StreamWindow), grpc.InitialConnWindowSize(ConnWindow)}
}

// DialOptions are a client's: the agent's uplink, and the load generator,
// which stands for agents.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(StreamWindow), grpc.WithInitialConnWindowSize(ConnWindow)}
}
