package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// hostileNode is an ingest client written against the proto: a node with
// a valid token that sends what no agent would.
type hostileNode struct {
	t      *testing.T
	stream grpc.BidiStreamingClient[trainmeterv1.StreamRequest, trainmeterv1.StreamResponse]
	seq    uint64
	// refused: the run ids of the StartRefused advisories received.
	refused map[string]string
}

func dialHostileNode(t *testing.T, addr, node, token string) *hostileNode {
	t.Helper()
	creds, err := tlsfiles.StaticToken(token, true)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := trainmeterv1.NewIngestServiceClient(conn).Stream(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	h := &trainmeterv1.Hello{Node: node, BootId: "hostile-boot", AgentVersion: "hostile",
		Gpus: []*trainmeterv1.GpuInfo{{Index: 0, Uuid: "GPU-hostile-0"}}}
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: h}}); err != nil {
		t.Fatal(err)
	}
	return &hostileNode{t: t, stream: stream, refused: map[string]string{}}
}

// send sends a batch (its seq and window set here) and returns the reject
// reason, "" when it was acked.
func (h *hostileNode) send(b *trainmeterv1.Batch) string {
	h.t.Helper()
	h.seq++
	now := time.Now()
	b.Seq = h.seq
	b.WindowStart, b.WindowEnd = timestamppb.New(now.Add(-time.Second)), timestamppb.New(now)
	if err := h.stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: b}}); err != nil {
		h.t.Fatalf("send batch %d: %v", h.seq, err)
	}
	for {
		resp, err := h.stream.Recv()
		if err != nil {
			h.t.Fatalf("batch %d: %v", h.seq, err)
		}
		switch {
		case resp.GetAck() != nil && resp.GetAck().GetSeq() == h.seq:
			return ""
		case resp.GetReject() != nil && resp.GetReject().GetSeq() == h.seq:
			return resp.GetReject().GetReason()
		case resp.GetAdvisory().GetStartRefused() != nil:
			h.refused[resp.GetAdvisory().GetRunId()] = resp.GetAdvisory().GetStartRefused().GetReason()
		}
	}
}

func hostileWindow(run string, energy float64) *trainmeterv1.RunWindow {
	now := time.Now()
	return &trainmeterv1.RunWindow{RunId: run, Start: timestamppb.New(now.Add(-time.Second)), End: timestamppb.New(now),
		Phase: trainmeterv1.Phase_PHASE_MEASURED, EnergyCounterJ: energy, CounterOk: true, EnergyIntegratedJ: energy,
		GpuSeconds: 1, Gpus: []uint32{0}, Tokens: 1000, Steps: 1}
}

func startEvent(run string) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{
		RunId: run, Time: timestamppb.Now(), Metadata: &trainmeterv1.RunMetadata{Model: "m"}}}}
}

func endEvent(run string) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{RunId: run, Time: timestamppb.Now()}}}
}

// rssMiB is the resident set of process pid (Linux), in MiB.
func rssMiB(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// A node holding its own valid ingest token attacks other parties' figures
// through the real collector: windows, events and loss records for another
// node's ended run, runs never started (150,000 ids), more live and new runs
// than the collector allows, an oversized batch. Each is refused; the
// victim's report is byte-identical before and after; the refusals are
// counted per node in /status; the collector's RSS stays bounded.
func TestHostileNodeCannotChangeAnotherNodesRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const (
		node1Tok = "e2e-node1-token-4c1f"
		node2Tok = "e2e-node2-token-9e2b"
		readTok  = "e2e-read-token-77d0"
		adminTok = "e2e-admin-token-a1a1"
	)
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ingestFile := file("ingest-tokens.yaml", "node1: "+node1Tok+"\nnode2: "+node2Tok+"\n")
	readFile, adminFile := file("read.token", readTok+"\n"), file("admin.token", adminTok+"\n")
	agentTok := file("agent.token", node1Tok+"\n")

	addr, status := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cmd := daemon(t, "trainmeter", "serve", "--listen", addr, "--data", filepath.Join(dir, "data"), "--status-listen", status,
		"--ingest-tokens", ingestFile, "--read-token-file", readFile, "--admin-token-file", adminFile,
		"--max-live-runs-per-node", "50", "--max-new-runs-per-minute", "80")
	readCreds, _ := tlsfiles.StaticToken(readTok, true)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(readCreds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &cluster{t: t, addr: addr, q: trainmeterv1.NewQueryServiceClient(conn)}
	c.eventually("collector answering", func() bool {
		_, err := c.q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{})
		return err == nil
	})

	// node1's run, through its agent, ended.
	sock := c.startAgent("node1", "sim:1", "--token-file", agentTok)
	c.waitStreaming("node1")
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"victim","model":"m","warmup_s":0}`)
	tr.runSteps("victim", 10, 1000, 50*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"victim"}`)
	tr.sync()
	c.waitEnded("victim")
	report := func() []byte {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "trainmeter"), "report", "victim", "--json", "--collector", addr, "--token-file", readFile)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("report --json: %v", err)
		}
		return out
	}
	// The end's last window and host share may follow the end by a batch.
	time.Sleep(3 * time.Second)
	before := report()

	h := dialHostileNode(t, addr, "node2", node2Tok)
	// 1. Windows of node1's ended run, 20 × 1e12 J; an eval, an end and a
	// loss record of it; and a start of it (refused: it ended everywhere).
	b := &trainmeterv1.Batch{}
	for range 20 {
		b.RunWindows = append(b.RunWindows, hostileWindow("victim", 1e12))
	}
	b.RunEvents = append(b.RunEvents, endEvent("victim"),
		&trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: "victim", Time: timestamppb.Now(), ValLoss: proto.Float64(9)}}})
	b.Losses = append(b.Losses, &trainmeterv1.DataLoss{RunId: "victim", Batches: 5, EnergyJ: 1e9, GpuSeconds: 10, Reason: "spool full"})
	if r := h.send(b); r != "" {
		t.Fatalf("the batch was rejected whole (%s); its own records should be kept and the others dropped", r)
	}
	if r := h.send(&trainmeterv1.Batch{RunEvents: []*trainmeterv1.RunEvent{startEvent("victim")},
		RunWindows: []*trainmeterv1.RunWindow{hostileWindow("victim", 1e12)}}); r != "" {
		t.Fatalf("start of the ended run: rejected whole: %s", r)
	}
	if _, ok := h.refused["victim"]; !ok {
		t.Errorf("no StartRefused for node2's start of the ended run victim")
	}

	// 2. Windows of runs never started: 15 batches of 10,000 ids.
	pid := cmd.Process.Pid
	rssBefore := rssMiB(t, pid)
	for i := range 15 {
		b := &trainmeterv1.Batch{}
		for j := range 10000 {
			b.RunWindows = append(b.RunWindows, hostileWindow(fmt.Sprintf("ghost-%d-%d", i, j), 1))
		}
		if r := h.send(b); r != "" {
			t.Fatalf("ghost batch %d rejected whole: %s", i, r)
		}
	}
	rssAfter := rssMiB(t, pid)
	t.Logf("collector RSS: %.0f MiB before 15 × 10,000 windows of runs never started, %.0f MiB after", rssBefore, rssAfter)
	if rssAfter > 300 {
		t.Errorf("collector RSS %.0f MiB after the ghost batches, want < 300 MiB", rssAfter)
	}
	runs, err := c.q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(runs.GetRuns()); n != 1 {
		t.Fatalf("%d runs after the ghost batches, want only victim", n)
	}

	// 3. Real starts: 100 in one batch, live limit 50; then 50 ended and
	// 100 more, new-run limit 80 a minute: 30 more.
	b = &trainmeterv1.Batch{}
	for i := range 100 {
		b.RunEvents = append(b.RunEvents, startEvent(fmt.Sprintf("own-%d", i)))
	}
	if r := h.send(b); r != "" {
		t.Fatalf("100 starts: rejected whole: %s", r)
	}
	if r := h.refused["own-99"]; !strings.Contains(r, "50 live runs") {
		t.Errorf("refusal of own-99: %q, want one naming the live-run limit", r)
	}
	b = &trainmeterv1.Batch{}
	for i := range 50 {
		b.RunEvents = append(b.RunEvents, endEvent(fmt.Sprintf("own-%d", i)))
	}
	for i := range 100 {
		b.RunEvents = append(b.RunEvents, startEvent(fmt.Sprintf("more-%d", i)))
	}
	if r := h.send(b); r != "" {
		t.Fatalf("ends and 100 more starts: rejected whole: %s", r)
	}
	if r := h.refused["more-99"]; !strings.Contains(r, "new runs") {
		t.Errorf("refusal of more-99: %q, want one naming the new-run limit", r)
	}
	runs, err = c.q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(runs.GetRuns()); n != 1+50+30 {
		t.Errorf("%d runs, want 81: victim, 50 under the live limit, 30 more under the new-run limit", n)
	}

	// 4. A batch over the run records a batch may hold: rejected whole.
	b = &trainmeterv1.Batch{}
	for range 10000 {
		b.RunWindows = append(b.RunWindows, hostileWindow("own-60", 1))
		b.RunEvents = append(b.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: "own-60", Time: timestamppb.Now()}}})
	}
	b.Losses = append(b.Losses, &trainmeterv1.DataLoss{RunId: "own-60", Batches: 1, Reason: "spool full"})
	if r := h.send(b); !strings.Contains(r, "more than 20000") {
		t.Errorf("batch of 20,001 run records: reject %q, want one naming the limit", r)
	}

	if after := report(); !bytes.Equal(before, after) {
		t.Errorf("victim's report changed:\nbefore %s\nafter  %s", before, after)
	}
	// The refusals, counted per node.
	resp, err := http.Get("http://" + status + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st struct {
		Ingest struct {
			RefusedRecordsPerNode map[string]uint64 `json:"refused_records_per_node"`
		} `json:"ingest"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("/status: %v\n%s", err, body)
	}
	if n := st.Ingest.RefusedRecordsPerNode["node2"]; n < 150000+24 {
		t.Errorf("/status refused_records_per_node[node2] = %d, want every refused record (>= 150,024)\n%s", n, body)
	}
	if n := st.Ingest.RefusedRecordsPerNode["node1"]; n != 0 {
		t.Errorf("/status refused_records_per_node[node1] = %d, want 0", n)
	}
}
