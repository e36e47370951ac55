package trainerwire

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestRunStartSendsOnlyWhatWasGiven(t *testing.T) {
	bs := int64(16)
	b, err := json.Marshal(RunStart{RunID: "r1", ClientID: "c", AttributePID: 42, Start: &trainmeterv1.RunStart{
		Metadata: &trainmeterv1.RunMetadata{Model: "m", BatchSize: &bs}, Labels: map[string]string{"team": "nlp"}}})
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
	_, err := json.Marshal(RunStart{RunID: "r1", Start: &trainmeterv1.RunStart{Labels: map[string]string{"model": "x"}}})
	if err == nil || !strings.Contains(err.Error(), `"model" is a run_start field`) {
		t.Fatalf("err %v", err)
	}
}

// The run_start keys are the proto's: this list changes with
// trainmeterv1.RunStart and RunMetadata (a field added there is a key, with
// no code), and the Python client's keyword arguments are checked against
// RunStartKeys.
func TestRunStartKeysComeFromTheProto(t *testing.T) {
	want := []string{"adjustment_interval", "attribute_pid", "backend", "batch_size", "budget_scope", "client_id",
		"cuda_visible_devices", "dataset", "dataset_size", "event", "gpu_price_per_hour", "gpus", "grad_accum",
		"local_rank", "max_ram_usage", "model", "notes", "num_workers", "optimizer", "params", "plan_key",
		"planned_epochs", "planned_steps", "planned_tokens", "precision", "prefetch_factor", "rank", "resume",
		"run_id", "seed", "seq_len", "target_gpu_utilization", "warmup_s", "warmup_steps", "world_size"}
	if got := RunStartKeys(); !slices.Equal(got, want) {
		t.Errorf("RunStartKeys()\n got %q\nwant %q", got, want)
	}
	for _, k := range want {
		if !IsRunStartKey(k) {
			t.Errorf("IsRunStartKey(%q) = false", k)
		}
	}
	for _, k := range []string{"team", "labels", "user", "time", "metadata", "resume_requested", ""} {
		if IsRunStartKey(k) {
			t.Errorf("IsRunStartKey(%q) = true", k)
		}
	}
}

// Every field of RunStart is either the agent's or a metadata key: a new
// field that is neither (a list or a message) must be named in agentSet.
func TestEveryRunStartFieldIsAccountedFor(t *testing.T) {
	fields := (*trainmeterv1.RunStart)(nil).ProtoReflect().Descriptor().Fields()
	for _, name := range agentSet {
		if fields.ByName(name) == nil {
			t.Errorf("agentSet names %q, which RunStart does not have", name)
		}
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !slices.Contains(agentSet, fd.Name()) && !slices.Contains(MetadataFields(), fd) {
			t.Errorf("RunStart.%s is neither set by the agent nor a run_start key", fd.Name())
		}
	}
	for _, k := range controlKeys {
		for _, fd := range MetadataFields() {
			if string(fd.Name()) == k {
				t.Errorf("%q is both a control key and a metadata field", k)
			}
		}
	}
}
