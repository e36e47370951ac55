// Package auth checks the bearer tokens of the collector's gRPC API.
//
// Three kinds of token, each from a file that is re-read when it changes (no
// restart needed to add a node or rotate a token):
//
//   - ingest: a YAML map `node: token`; the agent of that node sends its
//     token on the ingest stream, and the Hello it sends must name that node
//     (one node cannot report as another);
//   - read: one token for the query RPCs that only read;
//   - admin: one token for everything, including admin RPCs (DeleteRun, Reprice).
//
// Every method has a role in methodRoles. Health checks and server
// reflection are open (load balancers, grpcurl list). A method that is not in
// the table is refused, so a new RPC must be given a role before it can be
// called on a collector that has tokens.
//
// Tokens are compared in constant time (SHA-256 of both sides), and never
// logged nor echoed in errors.
package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Role is what a method needs.
type Role int

// Roles.
const (
	RoleOpen   Role = iota // no token (health, reflection)
	RoleIngest             // a node's ingest token
	RoleRead               // the read or the admin token
	RoleAdmin              // the admin token
)

func (r Role) String() string {
	return [...]string{"open", "ingest", "read", "admin"}[r]
}

// methodRoles is the access table: full gRPC method name → role.
var methodRoles = map[string]Role{
	trainmeterv1.IngestService_Stream_FullMethodName:    RoleIngest,
	trainmeterv1.QueryService_ListRuns_FullMethodName:   RoleRead,
	trainmeterv1.QueryService_GetRun_FullMethodName:     RoleRead,
	trainmeterv1.QueryService_ExportRuns_FullMethodName: RoleRead,
	trainmeterv1.QueryService_ListNodes_FullMethodName:  RoleRead,
	trainmeterv1.QueryService_Usage_FullMethodName:      RoleRead,
	trainmeterv1.QueryService_Compare_FullMethodName:    RoleRead,
	trainmeterv1.QueryService_Timeline_FullMethodName:   RoleRead,
	trainmeterv1.QueryService_DeleteRun_FullMethodName:  RoleAdmin,
	trainmeterv1.QueryService_Reprice_FullMethodName:    RoleAdmin,

	trainmeterv1.RecommendService_Recommend_FullMethodName:         RoleRead,
	trainmeterv1.RecommendService_DataloaderHistory_FullMethodName: RoleRead,
	trainmeterv1.BudgetService_SetBudget_FullMethodName:            RoleAdmin,
	trainmeterv1.BudgetService_DeleteBudget_FullMethodName:         RoleAdmin,
	trainmeterv1.BudgetService_ListBudgets_FullMethodName:          RoleRead,
	trainmeterv1.BudgetService_ListAlerts_FullMethodName:           RoleRead,
	trainmeterv1.BudgetService_Forecast_FullMethodName:             RoleRead,
	trainmeterv1.BudgetService_Estimate_FullMethodName:             RoleRead,
	// Read, as `trainmeter run` holds the read token: PlanRun only plans
	// runs the collector has not seen yet, so it cannot cap a running run.
	trainmeterv1.BudgetService_PlanRun_FullMethodName:     RoleRead,
	trainmeterv1.PriceService_ListPrices_FullMethodName:   RoleRead,
	trainmeterv1.PriceService_FetchPrices_FullMethodName:  RoleAdmin,
	trainmeterv1.PriceService_ImportPrices_FullMethodName: RoleAdmin,
}

// openPrefixes are services anyone may call.
var openPrefixes = []string{
	"/grpc.health.v1.Health/",
	"/grpc.reflection.v1.ServerReflection/",
	"/grpc.reflection.v1alpha.ServerReflection/",
}

// RoleOf returns the role a method needs and whether it is in the table.
func RoleOf(method string) (Role, bool) {
	if r, ok := methodRoles[method]; ok {
		return r, true
	}
	for _, p := range openPrefixes {
		if strings.HasPrefix(method, p) {
			return RoleOpen, true
		}
	}
	return 0, false
}

// Config names the token files; an empty name turns that check off.
type Config struct {
	// IngestTokensFile is a YAML map node → token. Set: every ingest stream
	// needs its node's token.
	IngestTokensFile string
	// ReadTokenFile and AdminTokenFile each hold one token. Either set: the
	// query API needs a token (read RPCs take either, admin RPCs only the
	// admin token; with no admin token file, admin RPCs are refused).
	ReadTokenFile, AdminTokenFile string
}

// Enabled reports whether any token is configured.
func (c Config) Enabled() bool {
	return c.IngestTokensFile != "" || c.ReadTokenFile != "" || c.AdminTokenFile != ""
}

type digest [sha256.Size]byte

type nodeTokens struct {
	nodes   []string
	digests []digest
}

// Auth checks tokens; build it with New.
type Auth struct {
	log    *slog.Logger
	ingest *tlsfiles.Watched[nodeTokens]
	read   *tlsfiles.Watched[digest]
	admin  *tlsfiles.Watched[digest]
	query  bool // read or admin configured
}

// New loads the token files. Each must be readable and well-formed now;
// later changes are picked up on the next call, and a broken edit keeps the
// previous tokens (with a warning in the log).
func New(cfg Config, log *slog.Logger) (*Auth, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Auth{log: log, query: cfg.ReadTokenFile != "" || cfg.AdminTokenFile != ""}
	var err error
	if cfg.IngestTokensFile != "" {
		f := cfg.IngestTokensFile
		if a.ingest, err = tlsfiles.Watch("ingest tokens", []string{f}, func() (nodeTokens, error) { return loadNodeTokens(f) }, log); err != nil {
			return nil, err
		}
	}
	one := func(what, f string) (*tlsfiles.Watched[digest], error) {
		if f == "" {
			return nil, nil
		}
		return tlsfiles.Watch(what, []string{f}, func() (digest, error) {
			tok, err := tlsfiles.ReadSecretFile(f)
			if err != nil {
				return digest{}, fmt.Errorf("%s: %w", what, err)
			}
			return sha256.Sum256([]byte(tok)), nil
		}, log)
	}
	if a.read, err = one("read token", cfg.ReadTokenFile); err != nil {
		return nil, err
	}
	if a.admin, err = one("admin token", cfg.AdminTokenFile); err != nil {
		return nil, err
	}
	if a.read != nil && a.admin != nil && a.read.Get() == a.admin.Get() {
		return nil, errors.New("the read token and the admin token must differ")
	}
	return a, nil
}

func loadNodeTokens(path string) (nodeTokens, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nodeTokens{}, fmt.Errorf("ingest tokens: %w", err)
	}
	var m map[string]string
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		// yaml errors quote at most a line number and a type, not values.
		return nodeTokens{}, fmt.Errorf("ingest tokens %s: want a YAML map of node: token: %v", path, yamlErrNoValue(err))
	}
	var nt nodeTokens
	seen := map[digest]string{}
	for node, tok := range m {
		tok = strings.TrimSpace(tok)
		if node == "" || tok == "" {
			return nodeTokens{}, fmt.Errorf("ingest tokens %s: node %q has an empty name or token", path, node)
		}
		d := sha256.Sum256([]byte(tok))
		if other, dup := seen[d]; dup {
			return nodeTokens{}, fmt.Errorf("ingest tokens %s: nodes %q and %q share a token; give each node its own", path, other, node)
		}
		seen[d] = node
		nt.nodes = append(nt.nodes, node)
		nt.digests = append(nt.digests, d)
	}
	return nt, nil
}

// yamlErrNoValue keeps a YAML error's position but not the text of the
// offending line, which may hold a token.
func yamlErrNoValue(err error) string {
	s := err.Error()
	if i := strings.Index(s, "line "); i >= 0 {
		j := i + len("line ")
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		return "syntax error at " + s[i:j]
	}
	return "syntax error"
}

// bearer extracts the token of an "authorization: Bearer TOKEN" header.
func bearer(ctx context.Context) (string, bool) {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return "", false
	}
	for _, v := range md.Get("authorization") {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			if t := strings.TrimSpace(v[7:]); t != "" {
				return t, true
			}
		}
	}
	return "", false
}

func eq(a, b digest) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }

// authorize checks the call's token for method. For the ingest stream it
// returns the node the token belongs to ("" when ingest tokens are off).
func (a *Auth) authorize(ctx context.Context, method string) (node string, err error) {
	role, known := RoleOf(method)
	if !known {
		a.deny(ctx, method, "method has no role in the access table")
		return "", status.Errorf(codes.PermissionDenied, "%s is not allowed on this collector", method)
	}
	switch role {
	case RoleOpen:
		return "", nil
	case RoleIngest:
		if a.ingest == nil {
			return "", nil
		}
	case RoleRead, RoleAdmin:
		if !a.query {
			return "", nil
		}
	}
	tok, ok := bearer(ctx)
	if !ok {
		a.deny(ctx, method, "no bearer token")
		return "", status.Error(codes.Unauthenticated, "this collector needs a bearer token (authorization: Bearer ...)")
	}
	d := sha256.Sum256([]byte(tok))
	switch role {
	case RoleIngest:
		nt := a.ingest.Get()
		found := -1
		for i := range nt.digests { // no early exit: time does not depend on which
			if eq(nt.digests[i], d) {
				found = i
			}
		}
		if found < 0 {
			a.deny(ctx, method, "unknown ingest token")
			return "", status.Error(codes.Unauthenticated, "invalid ingest token")
		}
		return nt.nodes[found], nil
	case RoleRead, RoleAdmin:
		isAdmin := a.admin != nil && eq(a.admin.Get(), d)
		isRead := a.read != nil && eq(a.read.Get(), d)
		switch {
		case isAdmin:
			return "", nil
		case isRead && role == RoleRead:
			return "", nil
		case isRead:
			a.deny(ctx, method, "read token on an admin RPC")
			return "", status.Errorf(codes.PermissionDenied, "%s needs the admin token", method)
		default:
			a.deny(ctx, method, "unknown query token")
			return "", status.Error(codes.Unauthenticated, "invalid token")
		}
	}
	return "", nil
}

func (a *Auth) deny(ctx context.Context, method, why string) {
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	a.log.Warn("request refused", "method", method, "peer", addr, "reason", why)
}

// UnaryInterceptor checks unary calls.
func (a *Auth) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if _, err := a.authorize(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor checks streams; on the ingest stream it also checks that
// the Hello names the token's node.
func (a *Auth) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		node, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if node != "" {
			ss = &nodeStream{ServerStream: ss, a: a, node: node, method: info.FullMethod}
		}
		return handler(srv, ss)
	}
}

// nodeStream refuses a Hello for another node than the token's.
type nodeStream struct {
	grpc.ServerStream
	a      *Auth
	node   string
	method string
}

func (s *nodeStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if req, ok := m.(*trainmeterv1.StreamRequest); ok {
		if h := req.GetHello(); h != nil && h.GetNode() != s.node {
			s.a.deny(s.Context(), s.method, fmt.Sprintf("token of node %q used for a hello of node %q", s.node, h.GetNode()))
			return status.Errorf(codes.PermissionDenied, "this token belongs to node %q, not %q", s.node, h.GetNode())
		}
	}
	return nil
}
