package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeTrace writes a replay trace: every GPU draws powerW; its counter
// advances at counterW (which may disagree with the power column).
func writeTrace(t *testing.T, gpus int, powerW, counterW float64, seconds float64) string {
	t.Helper()
	return writeGarbledTrace(t, gpus, powerW, counterW, seconds, 0)
}

// writeGarbledTrace is writeTrace with GPU 0's counter garbled (1.8e13 J,
// as a driver glitch gives) for one row every garbleEvery rows (0: none).
func writeGarbledTrace(t *testing.T, gpus int, powerW, counterW float64, seconds float64, garbleEvery int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct\n")
	for i := 0; float64(i)*0.1 <= seconds; i++ {
		ts := float64(i) * 0.1
		for g := 0; g < gpus; g++ {
			e := 5e5 + counterW*ts
			if g == 0 && garbleEvery > 0 && i > 0 && i%garbleEvery == 0 {
				e = 1.8e13
			}
			fmt.Fprintf(&b, "%.1f,%d,%g,%.3f,%d,81559,95\n", ts, g, powerW, e, 30000+1000*g)
		}
	}
	path := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func within(t *testing.T, what string, got, want, rel float64) {
	t.Helper()
	if math.Abs(got-want) > rel*math.Abs(want) {
		t.Errorf("%s = %.12f, want %.12f ± %.2g%%", what, got, want, rel*100)
	} else {
		t.Logf("%s = %.4f (want %.4f, off by %.3f%%)", what, got, want, 100*math.Abs(got-want)/math.Abs(want))
	}
}

func TestReplayedPowerGivesExactRunFigures(t *testing.T) {
	cases := []struct {
		name               string
		powerW, counterW   float64
		wantMethod         string
		wantEnergyW, intgW float64 // per GPU
		garbleEvery        int     // rows; 0: no garbled counter readings
	}{
		{"constant power, counter agrees", 300, 300, "counter", 300, 300, 0},
		{"counter disagrees with power", 300, 330, "counter", 330, 300, 0},
		// A garbled reading is dropped by the agent. Before, it became the
		// run's energy, the collector refused the batch, and every batch
		// after it (the refused one's loss record went on with each): the
		// run never ended at the collector.
		{"a garbled counter reading every 1.5 s", 300, 300, "counter", 300, 300, 15},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := startCollector(t)
			sock := c.startAgent("replay-node", "replay:"+writeGarbledTrace(t, 2, tc.powerW, tc.counterW, 60, tc.garbleEvery), "--warmup", "30s")
			// A run that starts before the GPUs' first counter point has its
			// first segment measured by power alone (docs/measurement.md).
			c.waitStreaming("replay-node")
			tr := dialTrainer(t, sock)
			tr.send(`{"event":"run_start","run_id":"r","model":"m","backend":"b","gpus":[0,1],"warmup_s":1}`)
			tr.runSteps("r", 40, 512, 100*time.Millisecond)
			tr.send(`{"event":"run_end","run_id":"r"}`)
			tr.sync()
			c.waitEnded("r")

			row := c.csvRow("r")
			wall, warm := num(t, row, "wall_s"), num(t, row, "warmup_s")
			measured := wall - warm
			within(t, "warmup_s", warm, 1, 0.001)
			within(t, "avg_power_W", num(t, row, "avg_power_W"), 2*tc.wantEnergyW, 0.01)
			within(t, "energy_J", num(t, row, "energy_J"), 2*tc.wantEnergyW*measured, 0.01)
			within(t, "energy_J_integrated", num(t, row, "energy_J_integrated"), 2*tc.intgW*measured, 0.01)
			within(t, "energy_total_J", num(t, row, "energy_total_J"), 2*tc.wantEnergyW*wall, 0.01)
			within(t, "peak_power_W", num(t, row, "peak_power_W"), 2*tc.powerW, 0.001)
			within(t, "J_per_token x tokens_measured", num(t, row, "J_per_token")*num(t, row, "tokens_measured"), num(t, row, "energy_J"), 1e-6)
			if row["energy_method"] != tc.wantMethod {
				t.Errorf("energy_method %q, want %q", row["energy_method"], tc.wantMethod)
			}
			if row["tokens_processed"] != "20480" {
				t.Errorf("tokens_processed %s, want 20480", row["tokens_processed"])
			}
			if row["gpus"] != "2" || row["nodes"] != "1" {
				t.Errorf("gpus %s nodes %s", row["gpus"], row["nodes"])
			}
			within(t, "vram_peak_MB", num(t, row, "vram_peak_MB"), 31000, 0)
			within(t, "vram_avg_MB", num(t, row, "vram_avg_MB"), 30500, 1e-9)
			if row["complete"] != "yes" || row["lost_batches"] != "0" {
				t.Errorf("complete %q lost_batches %q, want yes and 0", row["complete"], row["lost_batches"])
			}
		})
	}
}

func TestTwoAgentsReportingIntoOneRunAddUp(t *testing.T) {
	t.Parallel()
	c := startCollector(t)
	socks := []string{c.startAgent("node-a", "sim:1"), c.startAgent("node-b", "sim:1")}
	// Two ranks per node, each with its own connection and token counts.
	tokens := [][]int{{1000, 1001}, {2003, 4007}}
	var wg sync.WaitGroup
	sent := make([]int, 4)
	for n, sock := range socks {
		for r := 0; r < 2; r++ {
			wg.Add(1)
			go func(n, r int, sock string) {
				defer wg.Done()
				tr := dialTrainer(t, sock)
				tr.send(`{"event":"run_start","run_id":"multi","model":"m","warmup_s":0,"rank":%d}`, n*2+r)
				tr.runSteps("multi", 25, tokens[n][r], 20*time.Millisecond)
				sent[n*2+r] = 25 * tokens[n][r]
				tr.send(`{"event":"run_end","run_id":"multi"}`)
				tr.sync()
			}(n, r, sock)
		}
	}
	wg.Wait()
	c.waitEnded("multi")
	row := c.csvRow("multi")
	want := sent[0] + sent[1] + sent[2] + sent[3]
	if row["tokens_processed"] != fmt.Sprint(want) {
		t.Errorf("tokens_processed %s, want exactly %d", row["tokens_processed"], want)
	}
	if row["nodes"] != "2" || row["gpus"] != "2" {
		t.Errorf("nodes %s gpus %s, want 2 and 2", row["nodes"], row["gpus"])
	}
	if num(t, row, "energy_J") <= 0 {
		t.Errorf("energy_J %s", row["energy_J"])
	}
}

func TestGarbageOnTheSocketGetsErrorsAndChangesNothing(t *testing.T) {
	t.Parallel()
	c := startCollector(t)
	sock := c.startAgent("node", "sim:2")

	good := dialTrainer(t, sock)
	good.send(`{"event":"run_start","run_id":"good","gpus":[0],"warmup_s":0}`)
	good.sync()

	bad := dialTrainer(t, sock)
	cases := []struct{ line, want string }{
		{`this is not json`, "invalid JSON"},
		{`{"event":"teleport","run_id":"good"}`, `unknown event \"teleport\"`},
		{`{"event":"step","run_id":"good","tokens":-5}`, "tokens must be a non-negative integer"},
		{`{"event":"step","run_id":"good","tokens":NaN}`, "invalid JSON"},
		{`{"event":"step","run_id":"good","tokens":1.5}`, "tokens must be a non-negative integer"},
		{`{"event":"step","run_id":"nobody","tokens":10}`, `unknown run_id \"nobody\"`},
		{`{"event":"run_end","run_id":"good"}`, "did not join"},
		{"{\"event\":\"step\",\"run_id\":\"\xff\xfe\",\"tokens\":1}", "invalid UTF-8"},
	}
	for i, tc := range cases {
		bad.send("%s", tc.line)
		got := bad.readLine()
		if !strings.Contains(got, `"event":"error"`) || !strings.Contains(got, tc.want) || !strings.Contains(got, fmt.Sprintf(`"line":%d`, i+1)) {
			t.Errorf("line %q: reply %s, want an error containing %q", tc.line, got, tc.want)
		}
	}
	// A 10 MB line: an error, and the connection still works afterwards.
	huge := `{"event":"step","run_id":"good","tokens":1,"pad":"` + strings.Repeat("x", 10<<20) + `"}`
	bad.send("%s", huge)
	if got := bad.readLine(); !strings.Contains(got, "line too long") {
		t.Errorf("10 MB line: reply %s", got)
	}
	bad.sync()

	good.runSteps("good", 20, 777, 20*time.Millisecond)
	good.send(`{"event":"run_end","run_id":"good"}`)
	good.sync()
	c.waitEnded("good")
	row := c.csvRow("good")
	if row["tokens_processed"] != fmt.Sprint(20*777) {
		t.Errorf("tokens_processed %s, want %d: garbage must change nothing", row["tokens_processed"], 20*777)
	}
	if row["gpus"] != "1" {
		t.Errorf("gpus %s, want 1", row["gpus"])
	}
}
