package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestRunIDReusedOnAnotherNodeIsRefused: run shareA on box1 to its end;
// later start shareA on box2 without resume. Before, the collector merged
// the two into one run (2 nodes, tokens summed, wall time across the gap).
// Now the start is refused at the collector: box2's trainer gets the error
// line, as it would on box1, its later steps are dropped without an answer
// each, and the ended run's report is byte-identical. A resume from box2 is
// accepted; ranks of one launch starting 2 s apart on the two nodes join
// one run.
func TestRunIDReusedOnAnotherNodeIsRefused(t *testing.T) {
	t.Parallel()
	c := startCollector(t, "--gpu-price-per-hour", "3.6")
	s1, s2 := c.startAgent("box1", "sim:1"), c.startAgent("box2", "sim:1")
	c.waitStreaming("box1")
	c.waitStreaming("box2")

	tr := dialTrainer(t, s1)
	tr.send(`{"event":"run_start","run_id":"shareA","model":"m","warmup_s":0}`)
	tr.runSteps("shareA", 20, 1000, 20*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"shareA"}`)
	tr.sync()
	c.waitEnded("shareA")
	// The gap is 20 s; a few seconds show the same, and let the
	// run's last records settle.
	time.Sleep(3 * time.Second)
	before := c.cli("report", "shareA", "--json")

	tr2 := dialTrainer(t, s2)
	tr2.send(`{"event":"run_start","run_id":"shareA","model":"m","warmup_s":0}`)
	tr2.send(`{"event":"step","run_id":"shareA","step":1,"tokens":5000}`)
	line := tr2.readLine() // the agent says nothing to a run_start it takes: this is the collector's answer
	for _, want := range []string{`"event":"error"`, `run_start: run \"shareA\" already ended`, "box1", "resume=true", "new run_id"} {
		if !strings.Contains(line, want) {
			t.Errorf("the refused trainer's line lacks %q: %s", want, line)
		}
	}
	// Its later events are dropped, not answered one by one (sync would
	// fail on any other line).
	tr2.runSteps("shareA", 10, 5000, 20*time.Millisecond)
	tr2.send(`{"event":"run_end","run_id":"shareA"}`)
	tr2.sync()
	time.Sleep(3 * time.Second) // box2's batches of that time reach the collector
	if after := c.cli("report", "shareA", "--json"); after != before {
		t.Fatalf("the refused start changed the ended run:\nbefore %s\nafter  %s", before, after)
	}

	// resume=true from box2 continues the run.
	tr3 := dialTrainer(t, s2)
	tr3.send(`{"event":"run_start","run_id":"shareA","model":"m","warmup_s":0,"resume":true}`)
	tr3.runSteps("shareA", 10, 700, 20*time.Millisecond)
	tr3.send(`{"event":"run_end","run_id":"shareA"}`)
	tr3.sync()
	c.eventually("the resumed run ended with both parts' tokens", func() bool {
		r := c.getRun("shareA")
		return r.GetEnded() && r.GetTokensProcessed() == 20*1000+10*700
	})
	if r := c.getRun("shareA"); r.GetResumes() != 1 || r.GetNodes() != 2 {
		t.Errorf("resumed on box2: resumes %d nodes %d, want 1 and 2", r.GetResumes(), r.GetNodes())
	}

	// Two ranks of one launch, 2 s apart on the two nodes: one run.
	a, b := dialTrainer(t, s1), dialTrainer(t, s2)
	a.send(`{"event":"run_start","run_id":"launch","model":"m","warmup_s":0,"rank":0}`)
	a.sync()
	time.Sleep(2 * time.Second)
	b.send(`{"event":"run_start","run_id":"launch","model":"m","warmup_s":0,"rank":1}`)
	a.runSteps("launch", 10, 100, 20*time.Millisecond)
	b.runSteps("launch", 10, 100, 20*time.Millisecond)
	a.send(`{"event":"run_end","run_id":"launch"}`)
	b.send(`{"event":"run_end","run_id":"launch"}`)
	a.sync()
	b.sync()
	c.eventually("the launch ended on both nodes with both ranks' tokens", func() bool {
		r := c.getRun("launch")
		return r.GetEnded() && r.GetTokensProcessed() == 2000
	})
	if r := c.getRun("launch"); r.GetNodes() != 2 || r.GetResumes() != 0 {
		t.Errorf("two ranks 2 s apart: nodes %d resumes %d, want 2 and 0", r.GetNodes(), r.GetResumes())
	}
}
