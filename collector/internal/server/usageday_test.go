package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestUsagePerDayIsEachDaysOwnUsage: with per_day, the answer's rows and
// node totals are the period's as without it, and each UTC day's are what
// a request for that day alone answers, to the bit; the days cut at
// midnight (windows on both sides of 2025-03-01T00:00Z here) and to the
// period. per_day without a bounded period, or over more than 366 days, is
// refused.
func TestUsagePerDayIsEachDaysOwnUsage(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: usageGPUPrice, EnergyPricePerKWh: usageEnergyPrice})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n1 := tu.Connect(t, conn, "node-1", "boot-a")
	midnight := -12 * 3600.0 // tu.T0 is 12:00 UTC
	for i := range 6 {
		sec := midnight - 3 + float64(i)
		b := usageBatch(uint64(i+1), sec, map[bool]string{true: "c", false: ""}[i%2 == 0])
		if i == 0 {
			b.RunEvents = []*trainmeterv1.RunEvent{startAs("a", sec, "llama", "alice", "nlp"), startAs("b", sec, "llama", "bob", ""),
				startAs("c", sec, "bert", "carol", "vision")}
		}
		n1.MustAck(b)
	}
	since, until := tu.T0.Add(-36*time.Hour), tu.Now()
	for _, by := range [][]string{{"node"}, {"label:team"}, {"gpu", "user"}} {
		req := &trainmeterv1.UsageRequest{Since: timestamppb.New(since), Until: timestamppb.New(until), By: by}
		plain, err := q.Usage(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		req.PerDay = true
		perDay, err := q.Usage(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&trainmeterv1.UsageResponse{Rows: perDay.GetRows(), Nodes: perDay.GetNodes()}, &trainmeterv1.UsageResponse{Rows: plain.GetRows(), Nodes: plain.GetNodes()}) {
			t.Errorf("by %v: per_day changed the period's rows:\n%v\n%v", by, perDay, plain)
		}
		if len(perDay.GetDays()) != 2 {
			t.Fatalf("by %v: %d days, want 2 (the windows cross midnight)", by, len(perDay.GetDays()))
		}
		wantCuts := [][2]time.Time{{since, tu.T0.Add(-12 * time.Hour)}, {tu.T0.Add(-12 * time.Hour), tu.T0.Add(12 * time.Hour)}}
		for i, d := range perDay.GetDays() {
			if !d.GetSince().AsTime().Equal(wantCuts[i][0]) || !d.GetUntil().AsTime().Equal(earlier(wantCuts[i][1], until)) {
				t.Errorf("day %d: [%v, %v), want [%v, %v)", i, d.GetSince().AsTime(), d.GetUntil().AsTime(), wantCuts[i][0], earlier(wantCuts[i][1], until))
			}
			alone, err := q.Usage(t.Context(), &trainmeterv1.UsageRequest{Since: d.GetSince(), Until: d.GetUntil(), By: by})
			if err != nil {
				t.Fatal(err)
			}
			if len(alone.GetRows()) == 0 || !proto.Equal(&trainmeterv1.UsageDay{Since: d.GetSince(), Until: d.GetUntil(), Rows: alone.GetRows(), Nodes: alone.GetNodes()}, d) {
				t.Errorf("by %v day %d:\nper_day %v\nalone   %v", by, i, d, alone)
			}
		}
	}
	for _, req := range []*trainmeterv1.UsageRequest{
		{PerDay: true, Since: timestamppb.New(since)},
		{PerDay: true, Since: timestamppb.New(since.Add(-367 * 24 * time.Hour)), Until: timestamppb.New(since)},
	} {
		if _, err := q.Usage(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
