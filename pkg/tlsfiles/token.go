package tlsfiles

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"

	"google.golang.org/grpc/credentials"
)

// bearerCreds sends "authorization: Bearer TOKEN" on every RPC.
type bearerCreds struct {
	get           func() string
	allowInsecure bool
}

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.get()}, nil
}

// RequireTransportSecurity makes gRPC refuse to send the token over a
// plaintext connection, unless it was allowed (loopback).
func (b bearerCreds) RequireTransportSecurity() bool { return !b.allowInsecure }

// TokenFromFile returns per-RPC credentials that send the token read from
// path as a bearer token; the file is re-read when it changes (a rotated
// token is used from the next RPC or stream on). allowInsecure lets the token
// go over a plaintext connection (only for a loopback peer; see IsLoopback).
func TokenFromFile(path string, allowInsecure bool, log *slog.Logger) (credentials.PerRPCCredentials, error) {
	w, err := Watch("token file", []string{path}, func() (string, error) {
		tok, err := ReadSecretFile(path)
		if err == nil && strings.ContainsAny(tok, "\r\n") {
			err = errors.New(path + ": a token is one line")
		}
		return tok, err
	}, log)
	if err != nil {
		return nil, err
	}
	return bearerCreds{get: w.Get, allowInsecure: allowInsecure}, nil
}

// StaticToken is TokenFromFile for a token already in memory (the CLI's
// $TRAINMETER_TOKEN).
func StaticToken(tok string, allowInsecure bool) (credentials.PerRPCCredentials, error) {
	tok = strings.TrimSpace(tok)
	if tok == "" || strings.ContainsAny(tok, "\r\n") {
		return nil, errors.New("token is empty or not one line")
	}
	return bearerCreds{get: func() string { return tok }, allowInsecure: allowInsecure}, nil
}

// IsLoopback reports whether the host of addr (HOST:PORT) is "localhost" or
// a loopback IP: traffic to it never leaves the machine.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
