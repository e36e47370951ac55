package page

import (
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSize(t *testing.T) {
	for in, want := range map[int32]int{0: DefaultSize, 1: 1, 500: 500, MaxSize: MaxSize, MaxSize + 1: MaxSize, math.MaxInt32: MaxSize} {
		if got, err := Size(in); err != nil || got != want {
			t.Errorf("Size(%d) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := Size(-1); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Size(-1): %v, want InvalidArgument", err)
	}
}

func TestTokenRoundTripAndRefusals(t *testing.T) {
	req := Request("ListRuns", "a", "b")
	in := Token{Req: req, After: "run-9", Offset: 3, Best: map[string]float64{"m": 2.5, "nan": math.NaN()}, HasBest: true}
	tok := Encode(in)
	out, err := Decode(tok, req)
	if err != nil {
		t.Fatal(err)
	}
	if out.After != "run-9" || out.Offset != 3 || !out.HasBest || out.Best["m"] != 2.5 || len(out.Best) != 1 {
		t.Fatalf("round trip: %+v", out)
	}
	if got, err := Decode("", req); err != nil || got.After != "" || got.Offset != 0 {
		t.Fatalf("empty token: %+v, %v", got, err)
	}
	// The fingerprint keeps the parameters apart: ("a","b") is not ("ab").
	if Request("ListRuns", "a", "b") == Request("ListRuns", "ab") {
		t.Fatal("fingerprints of different run ids collide")
	}
	for name, c := range map[string]struct{ tok, req, why string }{
		"garbage":       {"%%%", req, "is not a page token"},
		"other request": {tok, Request("ListRuns"), "was issued for another request"},
		"old version":   {"eyJ2IjowfQ", req, "is not a page token"},
		"negative":      {Encode(Token{Req: req, Offset: -1}), req, "is not a page token"},
	} {
		_, err := Decode(c.tok, c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.why) ||
			!strings.Contains(err.Error(), "or no page_token for the first page") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestAll(t *testing.T) {
	pages := map[string]struct {
		items []int
		next  string
	}{"": {[]int{1, 2}, "p2"}, "p2": {nil, "p3"}, "p3": {[]int{3}, ""}}
	got, err := All(func(tok string) ([]int, string, error) { return pages[tok].items, pages[tok].next, nil })
	if err != nil || len(got) != 3 || got[2] != 3 {
		t.Fatalf("All: %v, %v", got, err)
	}
	// A token that comes back is an error, not a loop.
	_, err = All(func(tok string) ([]int, string, error) { return []int{1}, "same", nil })
	if err == nil || !strings.Contains(err.Error(), "does not advance") {
		t.Fatalf("repeated token: %v", err)
	}
	boom := errors.New("boom")
	if _, err := All(func(string) ([]int, string, error) { return nil, "", boom }); !errors.Is(err, boom) {
		t.Fatalf("fetch error: %v", err)
	}
}
