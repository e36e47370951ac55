// Package rpcerr marks the gRPC errors a collector returns when a service
// it depends on failed (every price provider, on `prices fetch`), so that a
// client tells them from not reaching the collector at all: both are
// codes.Unavailable (retry later), but only the second means "is the
// collector running?".
package rpcerr

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	domain         = "trainmeter.collector"
	reasonUpstream = "UPSTREAM_UNAVAILABLE"
)

// UpstreamUnavailable is a codes.Unavailable error with msg, marked as the
// collector's own answer about a service behind it.
func UpstreamUnavailable(msg string) error {
	st := status.New(codes.Unavailable, msg)
	if marked, err := st.WithDetails(&errdetails.ErrorInfo{Domain: domain, Reason: reasonUpstream}); err == nil {
		st = marked
	}
	return st.Err()
}

// FromUpstream reports whether st is an UpstreamUnavailable answer.
func FromUpstream(st *status.Status) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == domain && info.GetReason() == reasonUpstream {
			return true
		}
	}
	return false
}
