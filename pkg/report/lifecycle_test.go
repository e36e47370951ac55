package report

import (
	"bytes"
	"strings"
	"testing"
)

func TestReportShowsEndStatusAndPause(t *testing.T) {
	r := fullRun()
	r.EndStatus, r.PausedS, r.Resumes = "signal SIGTERM", 300, 1
	var b bytes.Buffer
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"run llama-sft-1 (ended: signal SIGTERM)", "between an end and a resume (1 resume; not run time, in no rate)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if !Failed(r) || EndStatus(r) != "signal SIGTERM" {
		t.Errorf("Failed %v EndStatus %q", Failed(r), EndStatus(r))
	}
	for st, failed := range map[string]bool{"ok": false, "ended": false, "": false, "stopped: budget": false, "error": true, "exit 2": true, "lost": true} {
		r.EndStatus = st
		if Failed(r) != failed {
			t.Errorf("%q: failed %v, want %v", st, Failed(r), failed)
		}
	}
	r.Ended = false
	if Failed(r) || EndStatus(r) != "running" {
		t.Errorf("live run: failed %v status %q", Failed(r), EndStatus(r))
	}
}
