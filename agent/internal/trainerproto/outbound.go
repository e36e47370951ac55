package trainerproto

import (
	"bytes"
	"encoding/json"

	"github.com/trainmeter/trainmeter/pkg/trainerwire"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

type adviceLine struct {
	Event          string `json:"event"`
	RunID          string `json:"run_id"`
	Kind           string `json:"kind"`
	NumWorkers     int    `json:"num_workers"`
	PrefetchFactor int    `json:"prefetch_factor"`
	Reason         string `json:"reason,omitempty"`
	// Measurements behind the advice (optional keys; clients ignore keys
	// they do not know). Pointers: absent when unknown.
	Classification string   `json:"classification,omitempty"`
	DataWaitShare  *float64 `json:"data_wait_share,omitempty"`
	GPUUtilization *float64 `json:"gpu_utilization,omitempty"`
	RAMUsage       *float64 `json:"ram_usage,omitempty"`
	ExpectedGain   *float64 `json:"expected_gain,omitempty"`
	MaxWorkers     int      `json:"max_workers,omitempty"`
	// The settings the advice was computed from (absent when unknown).
	FromNumWorkers     *int `json:"from_num_workers,omitempty"`
	FromPrefetchFactor *int `json:"from_prefetch_factor,omitempty"`
}

// ErrorLine builds {"event":"error","error":msg,"line":line}\n. line is the
// 1-based line number on the connection; it is omitted when ≤ 0.
func ErrorLine(msg string, line int) []byte {
	return encode(trainerwire.ErrorLine{Event: trainerwire.EventError, Error: msg, Line: line})
}

// AdviceLine builds a dataloader advice line from the collector's advice:
// the settings
// {"event":"advice","run_id":…,"kind":"dataloader","num_workers":…,"prefetch_factor":…,"reason":…}
// and the figures that led to them: "classification", "data_wait_share",
// "gpu_utilization", "ram_usage", "expected_gain" (shares 0..1),
// "max_workers", and the baseline "from_num_workers" / "from_prefetch_factor".
// A negative gpu_utilization or ram_usage is unknown, and a
// from_prefetch_factor of 0 an unknown baseline: those keys are left out.
func AdviceLine(runID string, d *trainmeterv1.DataloaderAdvice) []byte {
	dataWait, gain, gpu, ram := d.GetDataWaitShare(), d.GetExpectedGain(), d.GetGpuUtilization(), d.GetRamUsage()
	fromWorkers, fromPrefetch := int(d.GetFromNumWorkers()), int(d.GetFromPrefetchFactor())
	l := adviceLine{Event: trainerwire.EventAdvice, RunID: runID, Kind: "dataloader",
		NumWorkers: int(d.GetNumWorkers()), PrefetchFactor: int(d.GetPrefetchFactor()), Reason: d.GetReason(),
		Classification: d.GetClassification(), DataWaitShare: &dataWait, ExpectedGain: &gain,
		MaxWorkers: int(d.GetMaxWorkers())}
	if gpu >= 0 {
		l.GPUUtilization = &gpu
	}
	if ram >= 0 {
		l.RAMUsage = &ram
	}
	if fromPrefetch > 0 {
		l.FromNumWorkers, l.FromPrefetchFactor = &fromWorkers, &fromPrefetch
	}
	return encode(l)
}

// StopLine builds {"event":"stop","run_id":…,"reason":…}\n.
func StopLine(runID, reason string) []byte {
	return encode(trainerwire.StopLine{Event: trainerwire.EventStop, RunID: runID, Reason: reason})
}

// encode marshals v as one compact JSON line ending in '\n', without HTML
// escaping. Invalid UTF-8 in strings is replaced by U+FFFD, so the result is
// always one valid line.
func encode(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Cannot happen for the fixed struct types above.
		return []byte(`{"event":"error","error":"internal: cannot encode line"}` + "\n")
	}
	return b.Bytes()
}
