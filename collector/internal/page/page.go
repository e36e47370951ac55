// Package page is the collector's server-side pagination of list RPCs
// (AIP-158): a page size with a default and a maximum, a byte budget per
// page that keeps every response under a gRPC client's default 4 MiB
// message limit, and an opaque page token bound to the request it was
// issued for.
package page

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	// DefaultSize is the page size of a request that names none, and
	// MaxSize the most items a page holds, whatever the request asks.
	DefaultSize = 1000
	MaxSize     = 1000
	// MaxBytes is the encoded size past which a page ends early: half the
	// 4 MiB a gRPC client takes by default, so that a page of large items
	// (a run report with many GPUs and nodes) still arrives.
	MaxBytes = 2 << 20
)

// Token is where a listing goes on: after the item with key After (lists
// in key order), or from Offset (lists of the ids a request names). Req
// fingerprints the request the token was issued for.
type Token struct {
	V      int    `json:"v"`
	Req    string `json:"r"`
	After  string `json:"a,omitempty"`
	Offset int    `json:"o,omitempty"`
	// Best is the listing's per-model best (accuracy points per USD) as of
	// its first page, so that every page of one listing scores its runs
	// against the same bests without reading every run again.
	Best    map[string]float64 `json:"b,omitempty"`
	HasBest bool               `json:"hb,omitempty"`
}

const version = 1

// Request fingerprints a request's method and parameters, which a token
// holds only for.
func Request(method string, params ...string) string {
	h := sha256.New()
	h.Write([]byte(method))
	for _, p := range params {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Size is the page size a request's page_size asks for: DefaultSize for 0,
// at most MaxSize; a negative size is InvalidArgument.
func Size(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, status.Errorf(codes.InvalidArgument, "page_size %d: want 0 (the default, %d) up to %d", n, DefaultSize, MaxSize)
	case n == 0:
		return DefaultSize, nil
	}
	return min(int(n), MaxSize), nil
}

// Decode reads a request's page_token ("": the first page, the zero
// Token). A token that is not one this collector issued for a request with
// fingerprint req is InvalidArgument, with what to do.
func Decode(tok, req string) (Token, error) {
	if tok == "" {
		return Token{}, nil
	}
	var t Token
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || json.Unmarshal(b, &t) != nil || t.V != version || t.Offset < 0 {
		return Token{}, Invalid(tok, "is not a page token")
	}
	if t.Req != req {
		return Token{}, Invalid(tok, "was issued for another request")
	}
	return t, nil
}

// Invalid is the InvalidArgument error for page token tok, which is not
// one the collector issued for the request (why says how).
func Invalid(tok, why string) error {
	return status.Errorf(codes.InvalidArgument,
		"page_token %q %s: pass the next_page_token of the previous response to the same request unchanged, or no page_token for the first page",
		abbrev(tok), why)
}

// Encode writes t as an opaque page token.
func Encode(t Token) string {
	t.V = version
	for k, v := range t.Best {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			delete(t.Best, k)
		}
	}
	b, err := json.Marshal(t)
	if err != nil {
		// A Token of strings, ints and finite floats always marshals.
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func abbrev(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// Budget counts a page's encoded size: Fits is whether one more item
// still goes in (the first always does).
type Budget struct {
	n, bytes int
}

// Fits adds m to the page if it fits the byte budget.
func (b *Budget) Fits(m proto.Message) bool { return b.FitsSize(proto.Size(m)) }

// FitsSize is Fits for an item of sz bytes (proto.Size).
func (b *Budget) FitsSize(sz int) bool {
	sz += 8 // the field's tag and length
	if b.n > 0 && b.bytes+sz > MaxBytes {
		return false
	}
	b.n++
	b.bytes += sz
	return true
}

// All pages through a listing: fetch reads the page of token ("" for the
// first) and returns its items and next_page_token. A listing whose token
// comes back twice does not advance and is an error, not a loop.
func All[T any](fetch func(token string) ([]T, string, error)) ([]T, error) {
	var out []T
	seen := map[string]bool{}
	tok := ""
	for {
		items, next, err := fetch(tok)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("the collector gave page token %q twice: its listing does not advance", abbrev(next))
		}
		seen[next], tok = true, next
	}
}
