package query_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/advice/dataloadersvc"
	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestTimelineRecordedEvents: the advice the advisor stored for a run and
// the alerts that concern it show on its timeline, served over real gRPC
// from a real store; others' alerts do not.
func TestTimelineRecordedEvents(t *testing.T) {
	st, err := store.Open(t.TempDir(), store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for s := range 10 {
		var evs []*trainmeterv1.RunEvent
		if s == 0 {
			evs = append(evs, tu.Start("r", 0, "m"))
		}
		if _, err := st.ApplyBatch("n1", "b", tu.Batch(uint64(s+1), float64(s), []*trainmeterv1.RunWindow{tu.Window("r", float64(s), 10, 100)}, evs...)); err != nil {
			t.Fatal(err)
		}
	}
	// An evaluation record as the advisor writes it (advisor.evalKey).
	ev, _ := proto.Marshal(&trainmeterv1.DataloaderEvaluation{Node: "n1", Time: tu.TS(4), Changed: true, Delivered: true,
		NumWorkers: 8, PrefetchFactor: 4, Reason: "data wait 30 %"})
	if err := st.PutRecords(dataloadersvc.Namespace, map[string][]byte{fmt.Sprintf("r\x00e\x00n1\x00%020d", tu.TS(4).AsTime().UnixNano()): ev}); err != nil {
		t.Fatal(err)
	}
	rec := &alert.Recorder{Store: st}
	for key, a := range map[string]alert.Alert{
		"b1": {Kind: alert.KindBudget, Message: "team:nlp at 75 %", Time: tu.TS(6).AsTime(), RunIDs: []string{"q", "r"}},
		"b2": {Kind: alert.KindBudget, Message: "other runs' budget", Time: tu.TS(6).AsTime(), RunIDs: []string{"q"}},
		"p1": {Kind: alert.KindPrice, Message: "Sim GPU price down 12 %", Time: tu.TS(7).AsTime(), GPUName: "Sim GPU"},
		"p2": {Kind: alert.KindPrice, Message: "H100 price down", Time: tu.TS(7).AsTime(), GPUName: "H100"},
		"p3": {Kind: alert.KindPrice, Message: "Sim GPU before the run", Time: tu.TS(-60).AsTime(), GPUName: "Sim GPU"},
	} {
		if _, err := rec.Fire(context.Background(), key, a); err != nil {
			t.Fatal(err)
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	trainmeterv1.RegisterQueryServiceServer(gs, query.New(st, nil, aggregate.Pricing{}))
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)

	resp, err := trainmeterv1.NewQueryServiceClient(tu.Dial(t, lis.Addr().String())).Timeline(context.Background(),
		&trainmeterv1.TimelineRequest{RunId: "r", Series: []string{"power_w"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range resp.GetEvents() {
		got = append(got, e.GetKind()+": "+e.GetText())
	}
	want := []string{"run_start: run starts", "warmup_end: measured phase starts", "advice: dataloader advice sent: num_workers 8, prefetch_factor 4 (data wait 30 %)",
		"budget_alert: team:nlp at 75 %", "price_alert: Sim GPU price down 12 %"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
