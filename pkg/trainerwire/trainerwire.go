// Package trainerwire is the vocabulary of the trainer socket protocol
// (docs/trainer-protocol.md) that the agent, which serves the socket, and
// `trainmeter run`, which speaks it as a client, share: event names, the
// keys run_start reads itself, the environment variables and the default
// socket path. It depends on the standard library only, so the collector's CLI can import it
// without the agent's wiring (cgo, NVML). The agent's parser and line
// builders are agent/internal/trainerproto.
package trainerwire

import (
	"encoding/json"
	"fmt"
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

// runStartKeys are the keys run_start decodes itself; every other scalar key
// becomes a label.
var runStartKeys = map[string]bool{
	"event": true, "run_id": true,
	"model": true, "dataset": true, "backend": true, "optimizer": true, "precision": true, "notes": true,
	"batch_size": true, "grad_accum": true, "seq_len": true, "seed": true,
	"warmup_s": true, "warmup_steps": true, "gpus": true, "cuda_visible_devices": true,
	"num_workers": true, "prefetch_factor": true, "planned_steps": true,
	"planned_tokens": true, "planned_epochs": true, "params": true, "dataset_size": true,
	"target_gpu_utilization": true, "max_ram_usage": true, "adjustment_interval": true,
	"gpu_price_per_hour": true, "budget_scope": true,
	"rank": true, "world_size": true, "local_rank": true, "client_id": true,
	"attribute_pid": true, "resume": true, "plan_key": true,
}

// IsRunStartKey says whether run_start reads key itself (so it cannot be a
// label).
func IsRunStartKey(key string) bool { return runStartKeys[key] }

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
