package auth

import (
	"context"
	"net/http"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Authorize checks a token presented outside gRPC (the web console, where
// it comes from a header or a cookie) for method, with exactly the rules
// the gRPC interceptors apply to that method: the console is one more
// client of the query API, not a second access policy. An empty token is
// "no token".
func (a *Auth) Authorize(ctx context.Context, method, token string) error {
	md := metadata.MD{}
	if token != "" {
		md.Set("authorization", "Bearer "+token)
	}
	_, err := a.authorize(metadata.NewIncomingContext(ctx, md), method)
	return err
}

// QueryTokens reports whether read or admin tokens are configured: whether
// a query needs a token at all.
func (a *Auth) QueryTokens() bool { return a != nil && a.query }

// ReadRequest reports whether r carries, in an Authorization: Bearer
// header, a token that the query API's read RPCs accept (the read or the
// admin token) on a collector that has query tokens. Without query tokens
// it is false: there is no token to present, and what such a collector
// keeps private it keeps from everyone.
func (a *Auth) ReadRequest(r *http.Request, method string) bool {
	if !a.QueryTokens() {
		return false
	}
	v := r.Header.Get("Authorization")
	if len(v) <= 7 || !strings.EqualFold(v[:7], "bearer ") {
		return false
	}
	return a.Authorize(r.Context(), method, strings.TrimSpace(v[7:])) == nil
}
