package ledger

import (
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func (r *rig) ends(run string) []*trainmeterv1.RunEnd {
	var out []*trainmeterv1.RunEnd
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if x := e.GetRunEnd(); x != nil && x.RunId == run {
				out = append(out, x)
			}
		}
	}
	return out
}

func (r *rig) starts(run string) []*trainmeterv1.RunStart {
	var out []*trainmeterv1.RunStart
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if x := e.GetRunStart(); x != nil && x.RunId == run {
				out = append(out, x)
			}
		}
	}
	return out
}

// An ended run's id is refused long after its window closed (before, it
// silently started the run again), also by an agent restored from a
// checkpoint; resume=true continues it, with no second warmup.
func TestEndedRunIDIsRefusedUnlessResumed(t *testing.T) {
	r := newRig(t, []float64{100, 100}, []float64{100, 100}, 10*time.Second)
	r.advance(time.Second)
	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "r"}); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "r"})
	r.advance(5 * time.Minute)

	err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "r"})
	if err == nil || !strings.Contains(err.Error(), `run "r" already ended`) || !strings.Contains(err.Error(), "new run_id") || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("reuse of an ended run id: %v", err)
	}
	restored := New(Config{Devices: r.l.cfg.Devices})
	if err := restored.Restore(r.now, r.l.Snapshot(), 0); err != nil {
		t.Fatal(err)
	}
	ended, _ := r.l.EndedRuns()
	restored.RestoreEnded(ended)
	if err := restored.StartRun(r.now, peer1, &trainerproto.RunStart{Run: "r"}); err == nil || !strings.Contains(err.Error(), "already ended") {
		t.Errorf("a restarted agent accepted the ended run id: %v", err)
	}

	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "r", Resume: true}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	r.advance(2 * time.Second)
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "r"})
	r.advance(2 * time.Second)
	if s := r.starts("r"); len(s) != 2 || s[0].Resume || !s[1].Resume {
		t.Fatalf("run starts %v, want a start and a resume", s)
	}
	for _, w := range r.windows("r") {
		if w.Start.AsTime().After(t0.Add(time.Minute)) && w.Phase != trainmeterv1.Phase_PHASE_MEASURED {
			t.Errorf("window %v after the resume is in warmup", w.Start.AsTime())
		}
	}
	if e := r.ends("r"); len(e) != 2 || e[1].EndStatus != "ok" {
		t.Errorf("ends %v", e)
	}
}

// A resume within the second before the end's window closed sends the end
// before the new start, so the collector sees the run end, then resume.
func TestResumeRightAfterTheEnd(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "r"})
	r.advance(time.Second)
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "r", Status: "exit 1"})
	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "r", Resume: true}); err != nil {
		t.Fatal(err)
	}
	r.advance(time.Second)
	_ = r.l.EndRun(r.at(0), peer1, &trainerproto.RunEnd{Run: "r"})
	r.advance(2 * time.Second)
	var order []string
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			switch {
			case e.GetRunStart() != nil:
				order = append(order, "start")
			case e.GetRunEnd() != nil:
				order = append(order, "end:"+e.GetRunEnd().EndStatus)
			}
		}
	}
	if strings.Join(order, ",") != "start,end:exit 1,start,end:ok" {
		t.Errorf("events %v", order)
	}
}

func TestEndStatus(t *testing.T) {
	for _, c := range []struct {
		name   string
		ends   []string // one run_end per rank; "-" is a rank that vanished
		stop   string
		expire bool
		want   string
	}{
		{"normal", []string{""}, "", false, "ok"},
		{"exit 0", []string{"exit 0"}, "", false, "ok"},
		{"python exception", []string{"error"}, "", false, "error"},
		{"free text", []string{"it broke"}, "", false, "error"},
		{"exit code", []string{"exit 3"}, "", false, "exit 3"},
		{"signal", []string{"signal sigterm"}, "", false, "signal SIGTERM"},
		{"one rank failed", []string{"", "exit 1"}, "", false, "exit 1"},
		{"ranks vanished", []string{"-", "-"}, "", false, "lost"},
		{"one rank ended", []string{"-", ""}, "", false, "ok"},
		{"budget stop", []string{"stopped"}, "budget team:x exceeded (100%)", false, "stopped: budget"},
		{"max-cost stop, SIGTERM", []string{"signal SIGTERM"}, "max-cost $5 reached", false, "stopped: max-cost"},
		{"crash after a stop", []string{"exit 1"}, "budget x", false, "exit 1"},
		{"restart grace expired", nil, "", true, "lost"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, []float64{100}, []float64{100}, 0)
			r.advance(time.Second)
			if c.expire {
				_ = r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "r"})
				r.advance(2 * time.Second)
				snap := r.l.Snapshot()
				r.l = New(Config{Devices: r.l.cfg.Devices})
				if err := r.l.Restore(r.now, snap, time.Second); err != nil {
					t.Fatal(err)
				}
				r.advance(3 * time.Second)
			} else {
				for i := range c.ends {
					_ = r.l.StartRun(r.at(0), Peer{ConnID: uint64(i + 1), UID: 1000}, &trainerproto.RunStart{Run: "r"})
				}
				r.advance(time.Second)
				if c.stop != "" {
					r.l.StopRequested("r", c.stop)
				}
				for i, st := range c.ends {
					p := Peer{ConnID: uint64(i + 1), UID: 1000}
					if st == "-" {
						r.l.Disconnected(r.at(0), p)
						continue
					}
					_ = r.l.EndRun(r.at(0), p, &trainerproto.RunEnd{Run: "r", Status: st})
				}
				r.advance(2 * time.Second)
			}
			e := r.ends("r")
			if len(e) != 1 || e[0].EndStatus != c.want {
				t.Fatalf("ends %v, want one with status %q", e, c.want)
			}
		})
	}
}

// resume=true on an id this node never saw end starts a run as usual, its
// warmup included (a script that always asks to resume).
func TestResumeOfAnUnknownRunKeepsItsWarmup(t *testing.T) {
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "new", Resume: true, WarmupS: ptr(1.5)}); err != nil {
		t.Fatal(err)
	}
	r.advance(3 * time.Second)
	if s := r.starts("new"); len(s) != 1 || s[0].Resume || s[0].WarmupS != 1.5 {
		t.Fatalf("starts %v, want one plain start with its 1.5 s warmup", s)
	}
	if w := r.windows("new"); len(w) == 0 || w[0].Phase != trainmeterv1.Phase_PHASE_WARMUP {
		t.Errorf("first window %v, want warmup", w)
	}
}
