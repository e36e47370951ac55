package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// statusOf fetches and decodes a daemon's GET /status.
func statusOf(t *testing.T, addr string) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("GET /status: %v", err)
	}
	return m
}

func healthz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// field walks a decoded JSON object: field(m, "socket", "parse_errors", "invalid_json").
func field(m map[string]any, path ...string) float64 {
	var v any = m
	for _, p := range path {
		o, _ := v.(map[string]any)
		v = o[p]
	}
	f, _ := v.(float64)
	return f
}

// TestBadInputTable sends every kind of bad trainer line to the real agent:
// each gets a clear error line on its connection, the agent's status counts
// it by kind, and a run reporting beside it loses nothing.
func TestBadInputTable(t *testing.T) {
	t.Parallel()
	cstatus := testkit.FreeAddr(t)
	c := startCollector(t, "--status-listen", cstatus)
	status := testkit.FreeAddr(t)
	sock := c.startAgent("node", "sim:2", "--status-listen", status)

	good := dialTrainer(t, sock)
	good.send(`{"event":"run_start","run_id":"good","model":"llama","backend":"torch","gpus":[0],"warmup_s":0}`)
	good.sync()

	bad := dialTrainer(t, sock)
	cases := []struct{ name, line, want string }{
		{"not JSON", `this is not json`, "invalid JSON"},
		{"truncated JSON", `{"event":"step","run_id":"good","tok`, "invalid JSON"},
		{"invalid UTF-8", "{\"event\":\"step\",\"run_id\":\"good\",\"tokens\":1,\"x\":\"\xff\"}", "invalid UTF-8"},
		{"NaN", `{"event":"step","run_id":"good","tokens":1,"loss":NaN}`, "invalid JSON"},
		{"1e400 (Inf)", `{"event":"step","run_id":"good","tokens":1,"compute_s":1e400}`, "compute_s"},
		{"negative tokens", `{"event":"step","run_id":"good","tokens":-5}`, "tokens must be a non-negative integer"},
		{"2^64 tokens", `{"event":"step","run_id":"good","tokens":18446744073709551616}`, "tokens must be a non-negative integer"},
		{"fractional tokens", `{"event":"step","run_id":"good","tokens":1.5}`, "tokens must be a non-negative integer"},
		{"negative data_wait_s", `{"event":"step","run_id":"good","tokens":1,"data_wait_s":-0.1}`, "data_wait_s"},
		{"unknown event", `{"event":"teleport","run_id":"good"}`, `unknown event \"teleport\"`},
		{"no event", `{"run_id":"good"}`, "event"},
		{"run_end before run_start", `{"event":"run_end","run_id":"never-started"}`, `unknown run_id \"never-started\"`},
		{"step for an unknown run", `{"event":"step","run_id":"nobody","tokens":10}`, `unknown run_id \"nobody\"`},
		{"run_end of a run this connection did not join", `{"event":"run_end","run_id":"good"}`, "did not join"},
		{"conflicting run_start", `{"event":"run_start","run_id":"good","model":"mistral","gpus":[1]}`,
			`run_start: metadata conflicts with run \"good\": model \"mistral\" != \"llama\"`},
		{"unknown GPU", `{"event":"run_start","run_id":"other","gpus":[7]}`, "not on this node"},
	}
	for i, tc := range cases {
		bad.send("%s", tc.line)
		got := bad.readLine()
		if !strings.Contains(got, `"event":"error"`) || !strings.Contains(got, tc.want) || !strings.Contains(got, fmt.Sprintf(`"line":%d`, i+1)) {
			t.Errorf("%s: reply %s, want an error containing %q", tc.name, got, tc.want)
		}
	}
	// Oversized: a 5 MiB line is refused without being buffered; the
	// connection still works afterwards.
	bad.send(`{"event":"step","run_id":"good","tokens":1,"pad":"%s"}`, strings.Repeat("x", 5<<20))
	if got := bad.readLine(); !strings.Contains(got, "line too long") {
		t.Errorf("5 MiB line: reply %s", got)
	}
	bad.sync()

	good.runSteps("good", 20, 777, 10*time.Millisecond)
	good.send(`{"event":"run_end","run_id":"good"}`)
	good.sync()
	c.waitEnded("good")
	row := c.csvRow("good")
	if row["tokens_processed"] != fmt.Sprint(20*777) || row["gpus"] != "1" || row["model"] != "llama" {
		t.Errorf("tokens %s gpus %s model %s: bad input must change nothing", row["tokens_processed"], row["gpus"], row["model"])
	}
	st := statusOf(t, status)
	if field(st, "socket", "parse_errors", "invalid_json") < 3 || field(st, "socket", "parse_errors", "invalid_utf8") < 1 ||
		field(st, "socket", "too_long") != 1 || field(st, "socket", "handler_errors") < 5 {
		t.Errorf("socket status %v", st["socket"])
	}
	if code, body := healthz(t, status); code != http.StatusOK {
		t.Errorf("agent healthz %d %s", code, body)
	}
	cs := statusOf(t, cstatus)
	if field(cs, "ingest", "batches_applied") < 1 || field(cs, "ingest", "connected_agents") != 1 ||
		field(cs, "ingest", "batches_rejected") != 0 || field(cs, "ingest", "store_write_p99_ms") <= 0 {
		t.Errorf("collector status %v", cs)
	}
	if code, body := healthz(t, cstatus); code != http.StatusOK || body != "ok" {
		t.Errorf("collector healthz %d %s", code, body)
	}
}

// TestThousandConcurrentClients: 1,000 trainer connections at once, all
// ranks of one run, each with its own token count: the collector's total is
// exact.
func TestThousandConcurrentClients(t *testing.T) {
	t.Parallel()
	c := startCollector(t)
	status := testkit.FreeAddr(t)
	// Every client is this test's uid: the per-uid cap (default 64,
	// docs/security.md) is raised to let all 1,000 in.
	sock := c.startAgent("node", "sim:1", "--status-listen", status, "--socket-max-conns-per-uid", "1000")
	const clients, steps = 1000, 3
	// Phase 1: every client joins and reports its steps; phase 2 (once all
	// have joined, so the run cannot end early): every client ends.
	var joined, wg sync.WaitGroup
	var failed atomic.Int32
	allJoined := make(chan struct{})
	syncReply := func(i int, conn net.Conn, rd *bufio.Reader, phase string) bool {
		_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		line, err := rd.ReadString('\n')
		if err != nil || !strings.Contains(line, `unknown event \"sync\"`) { // the only reply: no errors
			t.Errorf("client %d %s: %q %v", i, phase, line, err)
			return false
		}
		return true
	}
	for i := 0; i < clients; i++ {
		wg.Add(1)
		joined.Add(1)
		go func(i int) {
			defer wg.Done()
			ok := false
			defer func() {
				if !ok {
					failed.Add(1)
				}
			}()
			conn, err := net.Dial("unix", sock)
			if err != nil {
				joined.Done()
				t.Errorf("client %d: %v", i, err)
				return
			}
			defer conn.Close()
			rd := bufio.NewReader(conn)
			var b strings.Builder
			fmt.Fprintf(&b, `{"event":"run_start","run_id":"crowd","model":"m","warmup_s":0,"rank":%d}`+"\n", i)
			for s := 1; s <= steps; s++ {
				fmt.Fprintf(&b, `{"event":"step","run_id":"crowd","step":%d,"tokens":%d}`+"\n", s, i+1)
			}
			b.WriteString(`{"event":"sync","run_id":"x"}` + "\n")
			_, err = conn.Write([]byte(b.String()))
			good := err == nil && syncReply(i, conn, rd, "join")
			joined.Done()
			if !good {
				return
			}
			<-allJoined
			if _, err := conn.Write([]byte(`{"event":"run_end","run_id":"crowd"}` + "\n" + `{"event":"sync","run_id":"x"}` + "\n")); err != nil {
				return
			}
			ok = syncReply(i, conn, rd, "end")
		}(i)
	}
	joined.Wait()
	close(allJoined)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d clients failed", n, clients)
	}
	c.waitEnded("crowd")
	row := c.csvRow("crowd")
	want := steps * clients * (clients + 1) / 2
	if row["tokens_processed"] != fmt.Sprint(want) {
		t.Errorf("tokens_processed %s, want exactly %d", row["tokens_processed"], want)
	}
	if st := statusOf(t, status); field(st, "socket", "conns_accepted") < clients+1 || field(st, "socket", "conns_rejected") != 0 {
		t.Errorf("socket status %v", st["socket"])
	}
}

// TestNonReadingFloodersDoNotDisturbOthers: one client floods garbage and
// never reads the error replies; another floods valid steps as fast as it
// can. A calm run beside them gets exactly its numbers, the flood run gets
// exactly what it sent, and the agent stays healthy.
func TestNonReadingFloodersDoNotDisturbOthers(t *testing.T) {
	t.Parallel()
	c := startCollector(t, "--status-listen", "127.0.0.1:0")
	status := testkit.FreeAddr(t)
	sock := c.startAgent("node", "sim:2", "--status-listen", status)

	calm := dialTrainer(t, sock)
	calm.send(`{"event":"run_start","run_id":"calm","gpus":[0],"warmup_s":0}`)
	calm.sync()
	flood := dialTrainer(t, sock)
	flood.send(`{"event":"run_start","run_id":"flood","gpus":[1],"warmup_s":0}`)
	flood.sync()

	deaf, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var garbage, floodSteps atomic.Int64
	wg.Add(2)
	go func() { // garbage, never reading a reply
		defer wg.Done()
		chunk := []byte(strings.Repeat("garbage that is not json\n", 4000))
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = deaf.SetWriteDeadline(time.Now().Add(time.Second))
			n, _ := deaf.Write(chunk)
			garbage.Add(int64(n / 25))
		}
	}()
	go func() { // valid steps as fast as the socket takes them
		defer wg.Done()
		var b strings.Builder
		for i := 0; i < 2000; i++ {
			b.WriteString(`{"event":"step","run_id":"flood","tokens":3}` + "\n")
		}
		chunk := []byte(b.String())
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := flood.conn.Write(chunk); err != nil {
				t.Error(err)
				return
			}
			floodSteps.Add(2000)
		}
	}()
	calm.runSteps("calm", 30, 1001, 100*time.Millisecond) // 3 s under the floods
	calm.send(`{"event":"run_end","run_id":"calm"}`)
	calm.sync()
	close(stop)
	wg.Wait()
	flood.sync()
	flood.send(`{"event":"run_end","run_id":"flood"}`)
	flood.sync()

	c.waitEnded("calm")
	c.waitEnded("flood")
	if row := c.csvRow("calm"); row["tokens_processed"] != fmt.Sprint(30*1001) {
		t.Errorf("calm run: tokens_processed %s, want %d", row["tokens_processed"], 30*1001)
	}
	if row := c.csvRow("flood"); row["tokens_processed"] != fmt.Sprint(3*floodSteps.Load()) {
		t.Errorf("flood run: tokens_processed %s, want %d (every step it sent)", row["tokens_processed"], 3*floodSteps.Load())
	}
	st := statusOf(t, status)
	t.Logf("flood: %d steps; garbage: ~%d lines; socket status %v", floodSteps.Load(), garbage.Load(), st["socket"])
	if field(st, "socket", "parse_errors", "invalid_json") < 1000 || field(st, "socket", "replies_dropped") < 1 {
		t.Errorf("socket status %v: want the garbage counted and its unread replies dropped", st["socket"])
	}
	if code, body := healthz(t, status); code != http.StatusOK {
		t.Errorf("agent healthz after the floods: %d %s", code, body)
	}
	if field(st, "uplink", "batches_rejected") != 0 || field(st, "uplink", "batches_dropped") != 0 {
		t.Errorf("uplink status %v", st["uplink"])
	}
}
