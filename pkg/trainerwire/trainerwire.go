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
	"gpu_uuids", "gpu_name", "pid", "uid", "labels", "resume", "user", "resume_requested", "attribution"}

// metadataFields and runStartKeys are read from the descriptor once.
var metadataFields, runStartKeys = func() ([]protoreflect.FieldDescriptor, []string) {
	rs := (*trainmeterv1.RunStart)(nil).ProtoReflect().Descriptor()
	var fields []protoreflect.FieldDescriptor
	keys := slices.Clone(controlKeys)
	for _, m := range []protoreflect.MessageDescriptor{rs.Fields().ByName("metadata").Message(), rs} {
		for i := range m.Fields().Len() {
			fd := m.Fields().Get(i)
			if !(m == rs && slices.Contains(agentSet, fd.Name())) && !fd.IsList() && !fd.IsMap() && fd.Message() == nil {
				fields, keys = append(fields, fd), append(keys, string(fd.Name()))
			}
		}
	}
	slices.Sort(keys)
	return fields, keys
}()

// MetadataFields are the fields of trainmeterv1.RunStart and of its
// RunMetadata (ContainingMessage tells which) that the run_start key of
// the same name sets, as the trainer sent it: singular scalars, in
// declaration order, RunMetadata's first.
func MetadataFields() []protoreflect.FieldDescriptor { return metadataFields }

// Holder is the message of rs that holds metadata field fd: rs itself, or
// its Metadata (read-only and empty when rs has none).
func Holder(rs *trainmeterv1.RunStart, fd protoreflect.FieldDescriptor) protoreflect.Message {
	if fd.ContainingMessage() == rs.ProtoReflect().Descriptor() {
		return rs.ProtoReflect()
	}
	return rs.GetMetadata().ProtoReflect()
}

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
// only what it was given (empty and nil fields, and metadata fields not
// set, are left out, so a joining script's client may fill them). Labels
// go on the wire as extra scalar keys (docs/protocol.md); a label named
// like a field is an error.
type RunStart struct {
	RunID        string   `json:"run_id"`
	ClientID     string   `json:"client_id,omitempty"`
	AttributePID int      `json:"attribute_pid,omitempty"`
	Resume       bool     `json:"resume,omitempty"`
	WarmupS      *float64 `json:"warmup_s,omitempty"`
	// Start holds the run's metadata (MetadataFields; the plan_key PlanRun
	// returned for a --max-cost plan among them) and its labels.
	Start *trainmeterv1.RunStart `json:"-"`
}

// MarshalJSON writes the line's object: "event", the control keys, then
// the metadata set and the labels.
func (r RunStart) MarshalJSON() ([]byte, error) {
	type fields RunStart // without this method
	b, err := json.Marshal(struct {
		Event string `json:"event"`
		fields
	}{EventRunStart, fields(r)})
	more := map[string]any{}
	for k, v := range r.Start.GetLabels() {
		if IsRunStartKey(k) {
			return nil, fmt.Errorf("label %q is a run_start field, not a label", k)
		}
		more[k] = v
	}
	for _, fd := range metadataFields {
		if m := Holder(r.Start, fd); m.Has(fd) {
			more[string(fd.Name())] = m.Get(fd).Interface()
		}
	}
	if err != nil || len(more) == 0 {
		return b, err
	}
	m, err := json.Marshal(more)
	if err != nil {
		return nil, err
	}
	// Both are JSON objects: join {...} and {...} into one.
	return append(append(b[:len(b)-1], ','), m[1:]...), nil
}
