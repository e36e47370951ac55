// Package trainerwire is the vocabulary of the trainer socket protocol
// (docs/trainer-protocol.md) that the agent, which serves the socket, and
// `trainmeter run`, which speaks it as a client, share: event names, the
// keys run_start reads itself, the environment variables and the default
// socket path. It depends on the standard library and the generated proto
// only, so the collector's CLI can import it without the agent's wiring
// (cgo, NVML). The agent's parser and line builders are
// agent/internal/trainerproto.
package trainerwire

import (
	"encoding/json"
	"fmt"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Event names, as carried in the "event" key.
const (
	EventRunStart = "run_start"
	EventStep     = "step"
	EventEval     = "eval"
	EventRunEnd   = "run_end"

	// Agent to trainer only.
	EventError  = "error"
	EventAdvice = "advice"
	EventStop   = "stop"
)

// DefaultSocket is the agent's trainer socket when neither its config nor
// $TRAINMETER_SOCKET says otherwise.
const DefaultSocket = "/run/trainmeter/agent.sock"

// Environment variables a wrapped command gets from `trainmeter run` (and a
// client reads): the socket path and the run id to report into.
const (
	EnvSocket = "TRAINMETER_SOCKET"
	EnvRunID  = "TRAINMETER_RUN_ID"
)

// The run_start keys come from the proto the agent passes the run on in,
// trainmeterv1.RunStart: each field of its RunMetadata, and each of its
// own fields but those the agent sets itself, is the key of the same name
// (MetadataFields); besides, the control keys steer the agent. A key that
// is neither becomes a label.

// controlKeys are the run_start keys that steer the agent rather than
// describe the run; the agent reads them itself (its decoder names each).
var controlKeys = []string{"event", "run_id", "gpus", "cuda_visible_devices", "warmup_s", "warmup_steps",
	"rank", "world_size", "local_rank", "client_id", "attribute_pid", "resume"}

// agentSet are the fields of trainmeterv1.RunStart that no trainer key
// sets: the agent fills them from its clock, the peer's credentials, its
// GPUs and the control keys (labels: from the keys that are none of these).
var agentSet = []protoreflect.Name{"run_id", "time", "metadata", "warmup_s", "warmup_steps", "gpus",
	"gpu_uuids", "gpu_name", "pid", "uid", "labels", "resume", "user", "resume_requested"}

var (
	metadataFields = metadataFieldsOf((*trainmeterv1.RunStart)(nil).ProtoReflect().Descriptor())
	runStartKeys   = func() []string {
		keys := slices.Clone(controlKeys)
		for _, fd := range metadataFields {
			keys = append(keys, string(fd.Name()))
		}
		slices.Sort(keys)
		return keys
	}()
)

func metadataFieldsOf(rs protoreflect.MessageDescriptor) []protoreflect.FieldDescriptor {
	var out []protoreflect.FieldDescriptor
	add := func(fields protoreflect.FieldDescriptors, skip []protoreflect.Name) {
		for i := range fields.Len() {
			fd := fields.Get(i)
			if !slices.Contains(skip, fd.Name()) && fd.Cardinality() != protoreflect.Repeated && fd.Message() == nil {
				out = append(out, fd)
			}
		}
	}
	add(rs.Fields().ByName("metadata").Message().Fields(), nil)
	add(rs.Fields(), agentSet)
	return out
}

// MetadataFields are the fields of trainmeterv1.RunStart and of its
// RunMetadata (ContainingMessage tells which) that the run_start key of
// the same name sets, as the trainer sent it: singular scalars, in
// declaration order, RunMetadata's first.
func MetadataFields() []protoreflect.FieldDescriptor { return metadataFields }

// RunStartKeys are the keys run_start reads itself, sorted: the control
// keys and the metadata keys. A client may send any of them; every other
// scalar key becomes a label.
func RunStartKeys() []string { return slices.Clone(runStartKeys) }

// IsRunStartKey says whether run_start reads key itself (so it cannot be a
// label).
func IsRunStartKey(key string) bool {
	_, ok := slices.BinarySearch(runStartKeys, key)
	return ok
}

// RunEnd is the run_end line.
type RunEnd struct {
	Event  string `json:"event"` // EventRunEnd
	RunID  string `json:"run_id"`
	Status string `json:"status"`
	// Error is the cause of a failed end (an exception, "Type: message");
	// the agent keeps at most 1024 bytes of it.
	Error string `json:"error,omitempty"`
}

// ErrorLine is the agent's error line.
type ErrorLine struct {
	Event string `json:"event"` // EventError
	Error string `json:"error"`
	// Line is the 1-based line number on the connection; omitted when ≤ 0.
	Line int `json:"line,omitempty"`
}

// StopLine is the agent's request that a run stop.
type StopLine struct {
	Event  string `json:"event"` // EventStop
	RunID  string `json:"run_id"`
	Reason string `json:"reason,omitempty"`
}

// RunStart is the run_start line a client such as `trainmeter run` sends:
// only what it was given (empty and nil fields are left out, so a joining
// script's client may fill them). Labels go on the wire as extra scalar
// keys (docs/protocol.md); a label named like a field is an error.
type RunStart struct {
	RunID        string   `json:"run_id"`
	ClientID     string   `json:"client_id,omitempty"`
	AttributePID int      `json:"attribute_pid,omitempty"`
	Resume       bool     `json:"resume,omitempty"`
	Model        string   `json:"model,omitempty"`
	Dataset      string   `json:"dataset,omitempty"`
	Backend      string   `json:"backend,omitempty"`
	Optimizer    string   `json:"optimizer,omitempty"`
	Precision    string   `json:"precision,omitempty"`
	Notes        string   `json:"notes,omitempty"`
	BatchSize    *int64   `json:"batch_size,omitempty"`
	SeqLen       *int64   `json:"seq_len,omitempty"`
	WarmupS      *float64 `json:"warmup_s,omitempty"`
	BudgetScope  string   `json:"budget_scope,omitempty"`
	// PlanKey is the key PlanRun returned for the run's --max-cost plan:
	// the collector applies the plan only to a run whose start presents it.
	PlanKey string            `json:"plan_key,omitempty"`
	Labels  map[string]string `json:"-"`
}

// MarshalJSON writes the line's object: "event", the fields, then the labels.
func (r RunStart) MarshalJSON() ([]byte, error) {
	type fields RunStart // without this method
	b, err := json.Marshal(struct {
		Event string `json:"event"`
		fields
	}{EventRunStart, fields(r)})
	if err != nil || len(r.Labels) == 0 {
		return b, err
	}
	for k := range r.Labels {
		if IsRunStartKey(k) {
			return nil, fmt.Errorf("label %q is a run_start field, not a label", k)
		}
	}
	labels, err := json.Marshal(r.Labels)
	if err != nil {
		return nil, err
	}
	// Both are JSON objects: join {...} and {...} into one.
	return append(append(b[:len(b)-1], ','), labels[1:]...), nil
}
