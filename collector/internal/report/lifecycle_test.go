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
	if EndStatus(r) != "signal SIGTERM" {
		t.Errorf("EndStatus %q", EndStatus(r))
	}
	r.Ended = false
	if EndStatus(r) != "running" {
		t.Errorf("live run: status %q", EndStatus(r))
	}
}
