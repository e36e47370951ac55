package auth

import (
	"context"

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
