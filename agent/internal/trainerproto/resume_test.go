package trainerproto

import (
	"strings"
	"testing"
)

func TestParseResume(t *testing.T) {
	for line, want := range map[string]bool{
		`{"event":"run_start","run_id":"r","resume":true}`:  true,
		`{"event":"run_start","run_id":"r","resume":false}`: false,
		`{"event":"run_start","run_id":"r","resume":null}`:  false,
		`{"event":"run_start","run_id":"r"}`:                false,
	} {
		ev, err := Parse([]byte(line))
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if rs := ev.(*RunStart); rs.Resume != want || rs.Start.Labels["resume"] != "" {
			t.Errorf("%s: resume %v labels %v, want %v", line, rs.Resume, rs.Start.Labels, want)
		}
	}
	for _, bad := range []string{`1`, `"yes"`, `[true]`} {
		_, err := Parse([]byte(`{"event":"run_start","run_id":"r","resume":` + bad + `}`))
		if err == nil || !strings.HasPrefix(err.Error(), "run_start: resume must be true or false") {
			t.Errorf("resume %s: err = %v", bad, err)
		}
	}
}
