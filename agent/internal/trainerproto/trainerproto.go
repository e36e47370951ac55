// Package trainerproto parses and validates the newline-delimited JSON events
// that trainer processes send to the agent over its local Unix socket, and
// builds the lines the agent writes back (error, advice, stop).
//
// Parse never panics, never retains the input slice, and returns errors with
// short, stable messages meant to be sent back to the client verbatim, e.g.
//
//	step: tokens must be a non-negative integer
//
// Field errors are prefixed with the event name; the ErrKind constants list
// the envelope's errors.
package trainerproto

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/trainmeter/trainmeter/internal/batchcheck"
	"github.com/trainmeter/trainmeter/pkg/trainerwire"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// MaxEndErrorBytes bounds run_end's "error": a longer one is cut there, at
// a character boundary (a failing trainer is not refused its end).
const MaxEndErrorBytes = batchcheck.MaxEndErrorBytes

// Limits applied by Parse.
const (
	MaxRunIDBytes = 256 // run_id
	// MaxStepTokens caps one step's tokens (2^32, thousands of times any real
	// batch): a nonsense count must get an error line, not overflow a run's
	// total and have the collector reject a whole batch of everyone's data.
	MaxStepTokens = 1 << 32
	// MaxTokensTotal caps a rank's cumulative tokens_total (2^50, ~10^15).
	MaxTokensTotal   = 1 << 50
	MaxMetadataBytes = 1024    // model, dataset, notes, … and run_end status
	MaxLabels        = 64      // extra scalar keys kept in RunStart.Labels
	MaxLabelBytes    = 256     // each label key and each label value
	MaxGPUs          = 64      // entries in run_start "gpus"
	MaxGPUBytes      = 128     // each "gpus" entry
	MaxPID           = 1 << 22 // run_start "attribute_pid" (Linux's PID_MAX_LIMIT)
)

// Event is one parsed inbound event.
type Event interface {
	Kind() string
	RunID() string
}

// RunStart is the "run_start" event: the run's metadata as the collector
// gets it, and the control keys (trainerwire) that steer the agent.
// Pointer fields are nil when the key is absent (or null).
type RunStart struct {
	Run string

	// Start holds what the metadata keys (trainerwire.MetadataFields) said,
	// in the fields of the same name, and the labels: every other scalar
	// key (string, number, bool), stringified, numbers keeping their JSON
	// text (unknown keys whose values are objects or arrays are ignored).
	// The agent sets the rest of it. Parse always sets Start and its
	// Metadata; nil means nothing was given.
	Start *trainmeterv1.RunStart

	// GPUs as sent: NVML indices ("0") or UUIDs ("GPU-..."); JSON integers
	// become decimal strings.
	GPUs               []string
	CUDAVisibleDevices string

	// The run's warmup, when the trainer names it (else the agent's default).
	WarmupS     *float64
	WarmupSteps *uint64

	Rank, WorldSize, LocalRank *int64

	// ClientID identifies the reporting process (rank) across reconnects and
	// agent restarts, so its cumulative tokens_total can be matched up.
	ClientID string

	// AttributePID, when set (> 0), asks the agent to attribute to the run
	// the GPUs on which this process or any of its descendants runs compute
	// work (`trainmeter run` sends its child's PID). Nil when absent.
	AttributePID *uint64

	// Resume asks to continue a run that has ended (resume=true): without
	// it, run_start for an ended run is refused.
	Resume bool
}

// Step is the "step" event.
type Step struct {
	Run                       string
	Step                      *uint64
	Tokens                    uint64
	Samples                   *uint64
	DataWaitS, ComputeS, Loss *float64
	// TokensTotal is the rank's cumulative token count for the run, counting
	// steps the client could not deliver. The agent credits the difference
	// to the last total it saw, so lost step events lose no tokens.
	TokensTotal *uint64
}

// Eval is the "eval" event.
type Eval struct {
	Run               string
	Epoch             *int64
	ValLoss, Accuracy *float64
	// NumWorkers / PrefetchFactor: the DataLoader settings the epoch ran
	// with (the advisor measures each epoch's throughput against them).
	NumWorkers, PrefetchFactor *int64
}

// RunEnd is the "run_end" event.
type RunEnd struct {
	Run    string
	Status string // optional "status" key; "" when absent
	// Error is the optional "error" key, the cause of a failure (an
	// exception, "Type: message") as given, cut to MaxEndErrorBytes at a
	// character boundary; "" when absent.
	Error string
}

func (*RunStart) Kind() string    { return trainerwire.EventRunStart }
func (e *RunStart) RunID() string { return e.Run }
func (*Step) Kind() string        { return trainerwire.EventStep }
func (e *Step) RunID() string     { return e.Run }
func (*Eval) Kind() string        { return trainerwire.EventEval }
func (e *Eval) RunID() string     { return e.Run }
func (*RunEnd) Kind() string      { return trainerwire.EventRunEnd }
func (e *RunEnd) RunID() string   { return e.Run }

// ErrKind classifies a parse error (for counters).
type ErrKind string

// Error kinds.
const (
	ErrKindUTF8         ErrKind = "invalid_utf8"   // "invalid UTF-8"
	ErrKindJSON         ErrKind = "invalid_json"   // "invalid JSON: …"
	ErrKindMissingEvent ErrKind = "missing_event"  // `missing "event"`, `"event" must be a string`
	ErrKindUnknownEvent ErrKind = "unknown_event"  // `unknown event "foo"`
	ErrKindRunID        ErrKind = "invalid_run_id" // "missing run_id", "run_id must be a string", "run_id too long: N bytes > 256", "run_id must be printable UTF-8"
	ErrKindField        ErrKind = "invalid_field"  // "<event>: <field> …"
)

// Error is the error type Parse returns.
type Error struct {
	Kind ErrKind
	Msg  string // full message, already prefixed
}

func (e *Error) Error() string { return e.Msg }

// Parse parses one line (with or without its trailing newline) into a
// *RunStart, *Step, *Eval or *RunEnd. The line is not retained.
func Parse(line []byte) (Event, error) {
	if !utf8.Valid(line) {
		return nil, &Error{Kind: ErrKindUTF8, Msg: "invalid UTF-8"}
	}
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, &Error{Kind: ErrKindJSON, Msg: "invalid JSON: expected an object"}
	}
	// Step lines, nearly all the traffic, are flat objects: scan them
	// without building a map (scanFlat declines anything unusual, which
	// then takes the general path below and gets the same result).
	flat := flatPool.Get().(*flatObject)
	defer flatPool.Put(flat)
	if scanFlat(trimmed, flat) {
		if ev, ok := flat.get("event"); ok && string(ev) == `"`+trainerwire.EventStep+`"` {
			d := decoder{event: trainerwire.EventStep, flat: flat}
			run, err := d.runID()
			if err != nil {
				return nil, err
			}
			return d.step(run)
		}
	}
	return parseGeneral(trimmed)
}

// parseGeneral parses a trimmed line that starts with '{' through
// encoding/json.
func parseGeneral(trimmed []byte) (Event, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return nil, &Error{Kind: ErrKindJSON, Msg: "invalid JSON: " + strings.TrimPrefix(err.Error(), "json: ")}
	}
	rawEv, ok := m["event"]
	if !ok || isNull(rawEv) {
		return nil, &Error{Kind: ErrKindMissingEvent, Msg: `missing "event"`}
	}
	var name string
	if kindOf(rawEv) != '"' || json.Unmarshal(rawEv, &name) != nil {
		return nil, &Error{Kind: ErrKindMissingEvent, Msg: `"event" must be a string`}
	}
	switch name {
	case trainerwire.EventRunStart, trainerwire.EventStep, trainerwire.EventEval, trainerwire.EventRunEnd:
	default:
		return nil, &Error{Kind: ErrKindUnknownEvent, Msg: "unknown event " + strconv.Quote(truncate(name, 64))}
	}

	d := decoder{event: name, m: m}
	run, err := d.runID()
	if err != nil {
		return nil, err
	}
	switch name {
	case trainerwire.EventRunStart:
		return d.runStart(run)
	case trainerwire.EventStep:
		return d.step(run)
	case trainerwire.EventEval:
		return d.eval(run)
	default:
		return d.runEnd(run)
	}
}

// decoder reads one event's keys. Its first error sticks: later reads
// return nothing, so an event reports the first bad key in reading order.
type decoder struct {
	event string
	m     map[string]json.RawMessage
	flat  *flatObject // instead of m, for lines scanFlat took
	err   error
}

// get returns the raw value of key; false when it is absent or an earlier
// key failed.
func (d *decoder) get(key string) (json.RawMessage, bool) {
	if d.err != nil {
		return nil, false
	}
	if d.flat != nil {
		return d.flat.get(key)
	}
	raw, ok := d.m[key]
	return raw, ok
}

// opt is get for an optional key: null is absent.
func (d *decoder) opt(key string) (json.RawMessage, bool) {
	raw, ok := d.get(key)
	return raw, ok && !isNull(raw)
}

// fail records an error about field unless one is recorded already.
func (d *decoder) fail(field, format string, args ...any) {
	d.failf("%s %s", field, fmt.Sprintf(format, args...))
}

// failf records an error of the event unless one is recorded already.
func (d *decoder) failf(format string, args ...any) {
	if d.err == nil {
		d.err = &Error{Kind: ErrKindField, Msg: d.event + ": " + fmt.Sprintf(format, args...)}
	}
}

// result is ev, or the first error.
func (d *decoder) result(ev Event) (Event, error) {
	if d.err != nil {
		return nil, d.err
	}
	return ev, nil
}

func (d *decoder) runID() (string, error) {
	raw, present := d.opt("run_id")
	s, isString := jsonString(raw)
	var msg string
	switch {
	case !present || isString && s == "":
		msg = "missing run_id"
	case !isString:
		msg = "run_id must be a string"
	case len(s) > MaxRunIDBytes:
		msg = fmt.Sprintf("run_id too long: %d bytes > %d", len(s), MaxRunIDBytes)
	case !printable(s):
		msg = "run_id must be printable UTF-8"
	default:
		return s, nil
	}
	return "", &Error{Kind: ErrKindRunID, Msg: msg}
}

// str decodes an optional string field bounded to max bytes.
func (d *decoder) str(key string, max int) string {
	raw, ok := d.opt(key)
	if !ok {
		return ""
	}
	var s string
	if kindOf(raw) != '"' || json.Unmarshal(raw, &s) != nil {
		d.fail(key, "must be a string")
		return ""
	}
	if len(s) > max {
		d.fail(key, "too long: %d bytes > %d", len(s), max)
		return ""
	}
	return s
}

// optional decodes the optional key with parse; a value parse refuses is
// the field error why.
func optional[T any](d *decoder, key string, parse func(json.RawMessage) (T, bool), why string) *T {
	raw, ok := d.opt(key)
	if !ok {
		return nil
	}
	v, ok := parse(raw)
	if !ok {
		d.fail(key, "%s", why)
		return nil
	}
	return &v
}

// uint decodes an optional non-negative integer that fits uint64.
func (d *decoder) uint(key string) *uint64 {
	return optional(d, key, parseUint, "must be a non-negative integer")
}

// bool decodes an optional true or false.
func (d *decoder) bool(key string) *bool {
	return optional(d, key, func(raw json.RawMessage) (bool, bool) {
		k := kindOf(raw)
		return k == 't', k == 't' || k == 'f'
	}, "must be true or false")
}

// int decodes an optional integer that fits int64; nonNeg rejects negatives.
func (d *decoder) int(key string, nonNeg bool) *int64 {
	if !nonNeg {
		return optional(d, key, parseInt, "must be an integer")
	}
	return optional(d, key, func(raw json.RawMessage) (int64, bool) {
		v, ok := parseInt(raw)
		return v, ok && v >= 0
	}, "must be a non-negative integer")
}

// float decodes an optional finite number; nonNeg rejects negatives.
func (d *decoder) float(key string, nonNeg bool) *float64 {
	if !nonNeg {
		return optional(d, key, parseFloat, "must be a finite number")
	}
	return optional(d, key, func(raw json.RawMessage) (float64, bool) {
		v, ok := parseFloat(raw)
		return v, ok && v >= 0
	}, "must be a finite non-negative number")
}

func (d *decoder) gpus() []string {
	raw, ok := d.opt("gpus")
	if !ok {
		return nil
	}
	const msg = "must be an array of GPU indices or UUIDs"
	var items []json.RawMessage
	if kindOf(raw) != '[' || json.Unmarshal(raw, &items) != nil {
		d.fail("gpus", msg)
		return nil
	}
	if len(items) > MaxGPUs {
		d.fail("gpus", "has too many entries: %d > %d", len(items), MaxGPUs)
		return nil
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		var s string
		ok := false
		switch kindOf(it) {
		case '"':
			ok = json.Unmarshal(it, &s) == nil && s != "" && len(s) <= MaxGPUBytes && printable(s)
		case '0':
			var v uint64
			v, ok = parseUint(it)
			s = strconv.FormatUint(v, 10)
		}
		if !ok {
			d.fail("gpus", msg)
			return nil
		}
		out = append(out, s)
	}
	return out
}

func (d *decoder) runStart(run string) (Event, error) {
	e := &RunStart{Run: run, Start: &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{}}}
	for _, fd := range trainerwire.MetadataFields() {
		d.metadata(trainerwire.Holder(e.Start, fd), fd)
	}
	e.CUDAVisibleDevices = d.str("cuda_visible_devices", MaxMetadataBytes)
	e.ClientID = d.str("client_id", MaxMetadataBytes)
	e.Rank, e.WorldSize, e.LocalRank = d.int("rank", true), d.int("world_size", true), d.int("local_rank", true)
	e.WarmupS = d.float("warmup_s", true)
	e.WarmupSteps = d.uint("warmup_steps")
	e.GPUs = d.gpus()
	if e.AttributePID = d.uint("attribute_pid"); e.AttributePID != nil && (*e.AttributePID == 0 || *e.AttributePID > MaxPID) {
		d.fail("attribute_pid", "must be a process id from 1 to %d", MaxPID)
	}
	resume := d.bool("resume")
	e.Resume = resume != nil && *resume
	if d.err == nil {
		e.Start.Labels = d.labels()
	}
	return d.result(e)
}

// metadataRules are the metadata keys whose values are narrower than their
// proto type allows; every other number must be non-negative.
var metadataRules = map[string]struct {
	signed bool
	ok     func(v float64) bool // nil: any value of the type
	why    string               // the error when not ok
}{
	"seed":                   {signed: true},
	"adjustment_interval":    {ok: func(v float64) bool { return v > 0 }, why: "must be a positive number of steps"},
	"target_gpu_utilization": {ok: fraction, why: "must be a fraction in (0, 1]"},
	"max_ram_usage":          {ok: fraction, why: "must be a fraction in (0, 1]"},
}

func fraction(v float64) bool { return v > 0 && v <= 1 }

// metadata decodes the metadata key named like field fd by the field's
// kind, and sets the field of m when the key has a value (not null).
func (d *decoder) metadata(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	key := string(fd.Name())
	rule := metadataRules[key]
	var v protoreflect.Value
	var num float64 // the value rule.ok judges
	switch fd.Kind() {
	case protoreflect.StringKind:
		if s := d.str(key, MaxMetadataBytes); s != "" {
			m.Set(fd, protoreflect.ValueOfString(s))
		}
		return
	case protoreflect.BoolKind:
		if b := d.bool(key); b != nil {
			m.Set(fd, protoreflect.ValueOfBool(*b))
		}
		return
	case protoreflect.DoubleKind:
		f := d.float(key, !rule.signed)
		if f == nil {
			return
		}
		v, num = protoreflect.ValueOfFloat64(*f), *f
	case protoreflect.Int64Kind:
		n := d.int(key, !rule.signed)
		if n == nil {
			return
		}
		v, num = protoreflect.ValueOfInt64(*n), float64(*n)
	case protoreflect.Uint64Kind, protoreflect.Uint32Kind:
		n := d.uint(key)
		if n == nil {
			return
		}
		if v, num = protoreflect.ValueOfUint64(*n), float64(*n); fd.Kind() == protoreflect.Uint32Kind {
			if *n > math.MaxUint32 {
				d.fail(key, "must be a non-negative integer")
				return
			}
			v = protoreflect.ValueOfUint32(uint32(*n))
		}
	default: // a kind no metadata field has yet: refused, never guessed
		d.fail(key, "has a %s type the agent cannot decode", fd.Kind())
		return
	}
	if rule.ok != nil && !rule.ok(num) {
		d.fail(key, "%s", rule.why)
		return
	}
	m.Set(fd, v)
}

// labels are the extra scalar keys, read in sorted order so that errors
// are stable.
func (d *decoder) labels() map[string]string {
	var labels map[string]string
	for _, k := range slices.Sorted(maps.Keys(d.m)) {
		if trainerwire.IsRunStartKey(k) {
			continue
		}
		raw := d.m[k]
		var v string
		switch kindOf(raw) {
		case '"':
			if json.Unmarshal(raw, &v) != nil {
				d.fail(strconv.Quote(truncate(k, 64)), "must be a string")
			}
		case '0', 't', 'f':
			v = string(bytes.TrimSpace(raw))
		default: // null, object, array: ignored
			continue
		}
		switch {
		case d.err != nil:
		case k == "" || !printable(k):
			d.failf("label keys must be non-empty printable UTF-8")
		case len(k) > MaxLabelBytes:
			d.failf("label key too long: %d bytes > %d", len(k), MaxLabelBytes)
		case len(v) > MaxLabelBytes:
			d.failf("label %s too long: %d bytes > %d", strconv.Quote(k), len(v), MaxLabelBytes)
		case len(labels) == MaxLabels:
			d.failf("too many extra keys: more than %d", MaxLabels)
		}
		if d.err != nil {
			return nil
		}
		if labels == nil {
			labels = make(map[string]string)
		}
		labels[k] = v
	}
	return labels
}

func (d *decoder) step(run string) (Event, error) {
	e := &Step{Run: run}
	raw, ok := d.get("tokens")
	if !ok {
		d.fail("tokens", "is required")
	} else if e.Tokens, ok = parseUint(raw); !ok {
		d.fail("tokens", "must be a non-negative integer")
	} else if e.Tokens > MaxStepTokens {
		d.fail("tokens", "too large: %d > %d per step", e.Tokens, uint64(MaxStepTokens))
	}
	e.Step = d.uint("step")
	if e.TokensTotal = d.uint("tokens_total"); e.TokensTotal != nil && *e.TokensTotal > MaxTokensTotal {
		d.fail("tokens_total", "too large: %d > %d", *e.TokensTotal, uint64(MaxTokensTotal))
	}
	e.Samples = d.uint("samples")
	e.DataWaitS, e.ComputeS, e.Loss = d.float("data_wait_s", true), d.float("compute_s", true), d.float("loss", false)
	return d.result(e)
}

func (d *decoder) eval(run string) (Event, error) {
	e := &Eval{Run: run}
	e.Epoch = d.int("epoch", true)
	e.ValLoss, e.Accuracy = d.float("val_loss", false), d.float("accuracy", true)
	e.NumWorkers, e.PrefetchFactor = d.int("num_workers", true), d.int("prefetch_factor", true)
	if e.PrefetchFactor != nil && e.NumWorkers == nil {
		d.fail("prefetch_factor", "needs num_workers (the loader settings are reported together)")
	}
	return d.result(e)
}

func (d *decoder) runEnd(run string) (Event, error) {
	e := &RunEnd{Run: run, Status: d.str("status", MaxMetadataBytes)}
	e.Error = CutUTF8(d.str("error", math.MaxInt), MaxEndErrorBytes)
	return d.result(e)
}

// CutUTF8 is s cut to at most max bytes, at a character boundary.
func CutUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	// s[cut] is the first byte left out: while it continues a character,
	// that character is left out whole.
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// kindOf classifies a raw JSON value by its first byte: '"', '{', '[', 't',
// 'f', 'n', or '0' for a number; 0 for anything else.
func kindOf(raw json.RawMessage) byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0
	}
	switch c := raw[0]; {
	case c == '"' || c == '{' || c == '[' || c == 't' || c == 'f' || c == 'n':
		return c
	case c == '-' || (c >= '0' && c <= '9'):
		return '0'
	}
	return 0
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// intText returns the integer text of a JSON number: plain integer literals,
// and literals whose fraction is all zeros ("65536.0"). Exponent forms are
// rejected.
func intText(raw json.RawMessage) (string, bool) {
	if kindOf(raw) != '0' {
		return "", false
	}
	s := string(bytes.TrimSpace(raw))
	if strings.ContainsAny(s, "eE") {
		return "", false
	}
	if i := strings.IndexByte(s, '.'); i >= 0 {
		if strings.Trim(s[i+1:], "0") != "" {
			return "", false
		}
		s = s[:i]
	}
	return s, true
}

func parseUint(raw json.RawMessage) (uint64, bool) {
	s, ok := intText(raw)
	if !ok {
		return 0, false
	}
	if s == "-0" {
		return 0, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func parseInt(raw json.RawMessage) (int64, bool) {
	s, ok := intText(raw)
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

func parseFloat(raw json.RawMessage) (float64, bool) {
	if kindOf(raw) != '0' {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	if v == 0 {
		v = 0 // normalise -0
	}
	return v, true
}

func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return CutUTF8(s, n) + "…"
}
