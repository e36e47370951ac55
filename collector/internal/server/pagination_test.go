package server_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestListRunsPages: ListRuns pages through every run in run id order,
// each once, with a run added mid-listing neither repeated nor shifting
// the pages; a token is refused (InvalidArgument, saying what to do) when
// it is not one issued for the same request.
func TestListRunsPages(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: 2})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	a := tu.Connect(t, conn, "node-1", "boot")
	var want []string
	for i := range 25 {
		id := fmt.Sprintf("run-%02d", i)
		want = append(want, id)
		a.MustAck(tu.Batch(uint64(i+1), float64(i), []*trainmeterv1.RunWindow{tu.Window(id, float64(i), 10, 5)}, tu.Start(id, float64(i), "m")))
	}

	var got []string
	tok, pages := "", 0
	for {
		resp, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{PageSize: 10, PageToken: tok})
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		pages++
		if len(resp.GetRuns()) > 10 {
			t.Fatalf("page %d has %d runs, asked for 10", pages, len(resp.GetRuns()))
		}
		for _, r := range resp.GetRuns() {
			got = append(got, r.GetRunId())
		}
		if pages == 1 {
			// Added behind the cursor: not in this listing, nothing repeated.
			a.MustAck(tu.Batch(100, 30, []*trainmeterv1.RunWindow{tu.Window("run-00a", 30, 10, 5)}, tu.Start("run-00a", 30, "m")))
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	if pages != 3 || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("%d pages of %v, want 3 pages of %v", pages, got, want)
	}

	// The runs a request names page in its order.
	ids := []string{"run-07", "run-03", "run-20", "run-00a", "run-11"}
	got, tok = nil, ""
	for {
		resp, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{RunIds: ids, PageSize: 2, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetRuns() {
			got = append(got, r.GetRunId())
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	if strings.Join(got, " ") != strings.Join(ids, " ") {
		t.Fatalf("named runs paged as %v, want %v", got, ids)
	}

	first, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{PageSize: 5})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	nodes, err := q.ListNodes(t.Context(), &trainmeterv1.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 1 || nodes.GetNextPageToken() != "" {
		t.Fatalf("ListNodes: %v, %v", nodes, err)
	}
	for name, req := range map[string]*trainmeterv1.ListRunsRequest{
		"garbage":            {PageToken: "not-a-token"},
		"not base64 JSON":    {PageToken: "eyJ2Ijo5fQ"}, // {"v":9}
		"for other run ids":  {RunIds: []string{"run-01"}, PageToken: first.GetNextPageToken()},
		"negative page size": {PageSize: -1},
	} {
		_, err := q.ListRuns(t.Context(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
			continue
		}
		msg := status.Convert(err).Message()
		if !strings.Contains(msg, "page_") {
			t.Errorf("%s: message %q does not name the page field", name, msg)
		}
		if strings.Contains(msg, "page_token") && !strings.Contains(msg, "next_page_token of the previous response") {
			t.Errorf("%s: message %q does not say what to pass", name, msg)
		}
	}
	// A ListRuns token is not a ListNodes token.
	if _, err := q.ListNodes(t.Context(), &trainmeterv1.ListNodesRequest{PageToken: first.GetNextPageToken()}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListNodes with a ListRuns token: %v, want InvalidArgument", err)
	}
}

// TestListRunsSkipByStart: a table's page N is ListRuns ordered by start
// (the newest first) with skip = (N-1) * page_size, every run on exactly
// one page; total_size counts the whole selection; ended_only leaves the
// live runs out; skip past the end is an empty page that still counts.
func TestListRunsSkipByStart(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: 2})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	a := tu.Connect(t, conn, "node-1", "boot")
	// run-00 starts first; every third run is live.
	var byStart, ended []string
	for i := range 25 {
		id := fmt.Sprintf("run-%02d", i)
		evs := []*trainmeterv1.RunEvent{tu.Start(id, float64(i), "m")}
		if i%3 != 0 {
			evs = append(evs, tu.End(id, float64(i)+1))
		}
		a.MustAck(tu.Batch(uint64(i+1), float64(i), []*trainmeterv1.RunWindow{tu.Window(id, float64(i), 10, 5)}, evs...))
	}
	for i := 24; i >= 0; i-- {
		byStart = append(byStart, fmt.Sprintf("run-%02d", i))
		if i%3 != 0 {
			ended = append(ended, fmt.Sprintf("run-%02d", i))
		}
	}
	for name, c := range map[string]struct {
		req  *trainmeterv1.ListRunsRequest
		want []string
	}{
		"by start":       {&trainmeterv1.ListRunsRequest{Order: trainmeterv1.RunOrder_RUN_ORDER_START_DESC}, byStart},
		"ended by start": {&trainmeterv1.ListRunsRequest{EndedOnly: true, Order: trainmeterv1.RunOrder_RUN_ORDER_START_DESC}, ended},
	} {
		var got []string
		for page := 0; page*10 < len(c.want)+10; page++ {
			c.req.Skip, c.req.PageSize = int32(page*10), 10
			resp, err := q.ListRuns(t.Context(), c.req)
			if err != nil {
				t.Fatalf("%s page %d: %v", name, page+1, err)
			}
			if resp.TotalSize == nil || int(resp.GetTotalSize()) != len(c.want) {
				t.Errorf("%s page %d: total_size %v, want %d", name, page+1, resp.TotalSize, len(c.want))
			}
			for _, r := range resp.GetRuns() {
				got = append(got, r.GetRunId())
			}
		}
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%s: pages by skip show %v, want %v", name, got, c.want)
		}
	}
	// The listing of every run by id has no size.
	if resp, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{}); err != nil || resp.TotalSize != nil {
		t.Errorf("ListRuns of every run: total_size %v (%v), want unset", resp.GetTotalSize(), err)
	}
	tok, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{EndedOnly: true, PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]*trainmeterv1.ListRunsRequest{
		"skip of every run by id": {Skip: 3},
		"negative skip":           {EndedOnly: true, Skip: -1},
		"skip with a page token":  {EndedOnly: true, Skip: 3, PageToken: tok.GetNextPageToken()},
		"live and ended only":     {LiveOnly: true, EndedOnly: true},
		"ended only with run_ids": {EndedOnly: true, RunIds: []string{"run-01"}},
		"an order this is not":    {Order: 99},
	} {
		if _, err := q.ListRuns(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

// TestListNodesPages: ListNodes pages by node name.
func TestListNodesPages(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: 2})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	for _, n := range []string{"node-c", "node-a", "node-b"} {
		a := tu.Connect(t, conn, n, "boot")
		a.MustAck(tu.Batch(1, 0, nil))
	}
	var got []string
	tok := ""
	for i := 0; ; i++ {
		resp, err := q.ListNodes(t.Context(), &trainmeterv1.ListNodesRequest{PageSize: 1, PageToken: tok})
		if err != nil || len(resp.GetNodes()) != 1 {
			t.Fatalf("page %d: %v, %v", i+1, resp, err)
		}
		got = append(got, resp.GetNodes()[0].GetNode())
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	if strings.Join(got, " ") != "node-a node-b node-c" {
		t.Fatalf("nodes paged as %v", got)
	}
}
