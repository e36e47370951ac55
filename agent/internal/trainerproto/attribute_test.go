package trainerproto

import (
	"strings"
	"testing"
)

func TestParseAttributePID(t *testing.T) {
	ev, err := Parse([]byte(`{"event":"run_start","run_id":"r","attribute_pid":4242,"model":"m"}`))
	if err != nil {
		t.Fatal(err)
	}
	rs := ev.(*RunStart)
	if rs.AttributePID == nil || *rs.AttributePID != 4242 {
		t.Fatalf("AttributePID = %v, want 4242", rs.AttributePID)
	}
	if rs.Start.Labels != nil {
		t.Fatalf("attribute_pid leaked into labels: %v", rs.Start.Labels)
	}
	ev, err = Parse([]byte(`{"event":"run_start","run_id":"r","attribute_pid":null}`))
	if err != nil || ev.(*RunStart).AttributePID != nil {
		t.Fatalf("null attribute_pid: %v, %v", ev, err)
	}
	for _, bad := range []string{`0`, `-1`, `1.5`, `"12"`, `true`, `4194305`} {
		_, err := Parse([]byte(`{"event":"run_start","run_id":"r","attribute_pid":` + bad + `}`))
		if err == nil || !strings.HasPrefix(err.Error(), "run_start: attribute_pid ") {
			t.Errorf("attribute_pid %s: err = %v", bad, err)
		}
	}
}
