package trainerwire

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRunStartSendsOnlyWhatWasGiven(t *testing.T) {
	bs := int64(16)
	b, err := json.Marshal(RunStart{RunID: "r1", ClientID: "c", AttributePID: 42, Model: "m", BatchSize: &bs,
		Labels: map[string]string{"team": "nlp"}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	want := map[string]any{"event": "run_start", "run_id": "r1", "client_id": "c", "attribute_pid": float64(42),
		"model": "m", "batch_size": float64(16), "team": "nlp"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (line %s)", k, got[k], v, b)
		}
	}
	// Every field the struct sends is one run_start reads itself.
	for k := range got {
		if k != "team" && !IsRunStartKey(k) {
			t.Errorf("RunStart sends %q, which the agent would take for a label", k)
		}
	}
}

func TestRunStartRefusesALabelNamedLikeAField(t *testing.T) {
	_, err := json.Marshal(RunStart{RunID: "r1", Labels: map[string]string{"model": "x"}})
	if err == nil || !strings.Contains(err.Error(), `"model" is a run_start field`) {
		t.Fatalf("err %v", err)
	}
}
