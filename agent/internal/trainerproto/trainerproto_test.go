package trainerproto

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func u64(v uint64) *uint64   { return &v }
func i64(v int64) *int64     { return &v }
func f64(v float64) *float64 { return &v }

func TestParseValid(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Event
	}{
		{
			name: "design run_start",
			line: `{"event":"run_start","run_id":"r1","model":"llama-3-8b","dataset":"sft","backend":"unsloth",
 "optimizer":"adamw_torch","batch_size":8,"grad_accum":4,"seq_len":2048,"precision":"bf16",
 "seed":42,"notes":"lora r=32","warmup_s":60,"gpus":[0,1],"num_workers":6,"prefetch_factor":2,
 "planned_steps":5000,"gpu_price_per_hour":2.1,"budget_scope":"llama-3-8b"}`,
			want: &RunStart{
				Run: "r1", Start: &trainmeterv1.RunStart{
					Metadata: &trainmeterv1.RunMetadata{Model: "llama-3-8b", Dataset: "sft", Backend: "unsloth",
						Optimizer: "adamw_torch", BatchSize: i64(8), GradAccum: i64(4), SeqLen: i64(2048),
						Precision: "bf16", Seed: i64(42), Notes: "lora r=32"},
					NumWorkers: proto.Uint32(6), PrefetchFactor: 2, PlannedSteps: 5000, GpuPricePerHour: 2.1,
					BudgetScope: "llama-3-8b"},
				WarmupS: f64(60), GPUs: []string{"0", "1"},
			},
		},
		{
			name: "run_start plan and dataloader targets",
			line: `{"event":"run_start","run_id":"r","planned_tokens":1000000,"planned_epochs":3,"params":124000000,
 "dataset_size":50000,"target_gpu_utilization":0.9,"max_ram_usage":0.7,"adjustment_interval":25}`,
			want: &RunStart{Run: "r", Start: &trainmeterv1.RunStart{
				PlannedTokens: 1000000, PlannedEpochs: 3, Params: 124000000,
				DatasetSize: 50000, TargetGpuUtilization: 0.9, MaxRamUsage: 0.7, AdjustmentInterval: 25,
			}},
		},
		{
			name: "run_start minimal",
			line: `{"event":"run_start","run_id":"r"}`,
			want: &RunStart{Run: "r"},
		},
		{
			name: "run_start uuids, ranks, labels, nulls, negative seed, warmup_steps",
			line: `{"event":"run_start","run_id":"r","gpus":["GPU-1a2b",3],"cuda_visible_devices":"0,1",
 "rank":1,"world_size":8,"local_rank":1,"seed":-7,"warmup_steps":100,"model":null,"team":"nlp",
 "lr":3e-4,"lora":true,"nested":{"a":1},"list":[1],"empty":null}`,
			want: &RunStart{
				Run: "r", GPUs: []string{"GPU-1a2b", "3"}, CUDAVisibleDevices: "0,1",
				Rank: i64(1), WorldSize: i64(8), LocalRank: i64(1), WarmupSteps: u64(100),
				Start: &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{Seed: i64(-7)},
					Labels: map[string]string{"team": "nlp", "lr": "3e-4", "lora": "true"}},
			},
		},
		{
			name: "design step",
			line: `{"event":"step","run_id":"r1","step":17,"tokens":65536,"samples":32,"data_wait_s":0.012,
 "compute_s":0.41,"loss":2.31}`,
			want: &Step{Run: "r1", Step: u64(17), Tokens: 65536, Samples: u64(32),
				DataWaitS: f64(0.012), ComputeS: f64(0.41), Loss: f64(2.31)},
		},
		{
			name: "step max tokens (2^32), negative loss, integral float tokens, unknown keys ignored",
			line: `{"event":"step","run_id":"r","tokens":4294967296,"loss":-0.5,"step":4.000,"extra":{"x":[1,2]}}` + "\r\n",
			want: &Step{Run: "r", Tokens: 4294967296, Loss: f64(-0.5), Step: u64(4)},
		},
		{
			name: "step zero tokens",
			line: ` {"event":"step","run_id":"r","tokens":0,"data_wait_s":0,"compute_s":1e-3} `,
			want: &Step{Run: "r", Tokens: 0, DataWaitS: f64(0), ComputeS: f64(0.001)},
		},
		{
			name: "design eval",
			line: `{"event":"eval","run_id":"r1","epoch":1,"val_loss":1.93,"accuracy":0.71}`,
			want: &Eval{Run: "r1", Epoch: i64(1), ValLoss: f64(1.93), Accuracy: f64(0.71)},
		},
		{
			name: "eval with the loader settings its epoch ran with",
			line: `{"event":"eval","run_id":"r1","epoch":2,"num_workers":0}`,
			want: &Eval{Run: "r1", Epoch: i64(2), NumWorkers: i64(0)},
		},
		{
			name: "eval with workers and prefetch",
			line: `{"event":"eval","run_id":"r1","num_workers":3,"prefetch_factor":4}`,
			want: &Eval{Run: "r1", NumWorkers: i64(3), PrefetchFactor: i64(4)},
		},
		{
			name: "design run_end",
			line: `{"event":"run_end","run_id":"r1"}` + "\n",
			want: &RunEnd{Run: "r1"},
		},
		{
			name: "run_end status, unicode run id",
			line: `{"event":"run_end","run_id":"лама-ü 1","status":"failed"}`,
			want: &RunEnd{Run: "лама-ü 1", Status: "failed"},
		},
		{
			name: "escaped run id",
			line: `{"event":"run_end","run_id":"a\u00e9b"}`,
			want: &RunEnd{Run: "aéb"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.line))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			// The proto part by proto.Equal (an unset want is what Parse
			// always sets: an empty start and metadata), the rest as is.
			if rs, ok := tt.want.(*RunStart); ok {
				want := *rs
				if want.Start == nil {
					want.Start = &trainmeterv1.RunStart{}
				}
				if want.Start.Metadata == nil {
					want.Start.Metadata = &trainmeterv1.RunMetadata{}
				}
				gotRS := *got.(*RunStart)
				if !proto.Equal(gotRS.Start, want.Start) {
					t.Fatalf("start got  %v\nwant %v", gotRS.Start, want.Start)
				}
				gotRS.Start, want.Start = nil, nil
				got, tt.want = &gotRS, &want
			}
			if !reflect.DeepEqual(got, tt.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(tt.want)
				t.Fatalf("got  %s\nwant %s", gj, wj)
			}
			if got.Kind() != tt.want.Kind() || got.RunID() != tt.want.RunID() {
				t.Fatalf("Kind/RunID = %q/%q", got.Kind(), got.RunID())
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	manyLabels := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"event":"run_start","run_id":"r"`)
		for i := 0; i < n; i++ {
			b.WriteString(`,"k` + strings.Repeat("x", i) + `":1`)
		}
		b.WriteString("}")
		return b.String()
	}
	tests := []struct {
		name string
		line string
		kind ErrKind
		msg  string // exact, or prefix when it ends in "…"
	}{
		// envelope
		{"invalid utf8", "{\"event\":\"step\",\"run_id\":\"r\xff\",\"tokens\":1}", ErrKindUTF8, "invalid UTF-8"},
		{"invalid utf8 outside strings", "\xc3\x28", ErrKindUTF8, "invalid UTF-8"},
		{"empty", "", ErrKindJSON, "invalid JSON: expected an object"},
		{"not json", "hello world", ErrKindJSON, "invalid JSON: expected an object"},
		{"array", `[1,2]`, ErrKindJSON, "invalid JSON: expected an object"},
		{"null", `null`, ErrKindJSON, "invalid JSON: expected an object"},
		{"truncated", `{"event":"step"`, ErrKindJSON, "invalid JSON: …"},
		{"trailing garbage", `{"event":"step","run_id":"r","tokens":1} x`, ErrKindJSON, "invalid JSON: …"},
		{"two objects", `{"event":"run_end","run_id":"r"}{"event":"run_end","run_id":"r"}`, ErrKindJSON, "invalid JSON: …"},
		{"NaN literal", `{"event":"step","run_id":"r","tokens":NaN}`, ErrKindJSON, "invalid JSON: …"},
		{"Infinity literal", `{"event":"step","run_id":"r","tokens":1,"loss":Infinity}`, ErrKindJSON, "invalid JSON: …"},
		{"missing event", `{"run_id":"r"}`, ErrKindMissingEvent, `missing "event"`},
		{"null event", `{"event":null,"run_id":"r"}`, ErrKindMissingEvent, `missing "event"`},
		{"event not string", `{"event":1,"run_id":"r"}`, ErrKindMissingEvent, `"event" must be a string`},
		{"unknown event", `{"event":"foo","run_id":"r"}`, ErrKindUnknownEvent, `unknown event "foo"`},
		{"outbound event inbound", `{"event":"error","run_id":"r"}`, ErrKindUnknownEvent, `unknown event "error"`},
		{"unknown event truncated", `{"event":"` + long(300) + `"}`, ErrKindUnknownEvent, `unknown event "` + long(64) + `…"`},
		// run_id
		{"missing run_id", `{"event":"step","tokens":1}`, ErrKindRunID, "missing run_id"},
		{"null run_id", `{"event":"eval","run_id":null}`, ErrKindRunID, "missing run_id"},
		{"empty run_id", `{"event":"run_end","run_id":""}`, ErrKindRunID, "missing run_id"},
		{"numeric run_id", `{"event":"run_end","run_id":1}`, ErrKindRunID, "run_id must be a string"},
		{"long run_id", `{"event":"run_end","run_id":"` + long(257) + `"}`, ErrKindRunID, "run_id too long: 257 bytes > 256"},
		{"control char run_id", `{"event":"run_end","run_id":"a\nb"}`, ErrKindRunID, "run_id must be printable UTF-8"},
		{"nul run_id", `{"event":"run_end","run_id":"a\u0000"}`, ErrKindRunID, "run_id must be printable UTF-8"},
		{"lone surrogate run_id", `{"event":"run_end","run_id":"a\ud800"}`, ErrKindRunID, "run_id must be printable UTF-8"},
		// step
		{"tokens missing", `{"event":"step","run_id":"r"}`, ErrKindField, "step: tokens is required"},
		{"tokens null", `{"event":"step","run_id":"r","tokens":null}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens negative", `{"event":"step","run_id":"r","tokens":-5}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens -3", `{"event":"step","run_id":"r","tokens":-3}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens fraction", `{"event":"step","run_id":"r","tokens":1.5}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens 1e30", `{"event":"step","run_id":"r","tokens":1e30}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens 1e3", `{"event":"step","run_id":"r","tokens":1e3}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens overflow", `{"event":"step","run_id":"r","tokens":18446744073709551616}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens NaN string", `{"event":"step","run_id":"r","tokens":"NaN"}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens numeric string", `{"event":"step","run_id":"r","tokens":"12"}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens bool", `{"event":"step","run_id":"r","tokens":true}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"tokens array", `{"event":"step","run_id":"r","tokens":[1]}`, ErrKindField, "step: tokens must be a non-negative integer"},
		{"step negative", `{"event":"step","run_id":"r","tokens":1,"step":-1}`, ErrKindField, "step: step must be a non-negative integer"},
		{"samples fraction", `{"event":"step","run_id":"r","tokens":1,"samples":0.5}`, ErrKindField, "step: samples must be a non-negative integer"},
		{"data_wait_s negative", `{"event":"step","run_id":"r","tokens":1,"data_wait_s":-0.1}`, ErrKindField, "step: data_wait_s must be a finite non-negative number"},
		{"data_wait_s string", `{"event":"step","run_id":"r","tokens":1,"data_wait_s":"0.1"}`, ErrKindField, "step: data_wait_s must be a finite non-negative number"},
		{"compute_s overflow", `{"event":"step","run_id":"r","tokens":1,"compute_s":1e400}`, ErrKindField, "step: compute_s must be a finite non-negative number"},
		{"loss NaN string", `{"event":"step","run_id":"r","tokens":1,"loss":"NaN"}`, ErrKindField, "step: loss must be a finite number"},
		{"loss overflow", `{"event":"step","run_id":"r","tokens":1,"loss":-1e999}`, ErrKindField, "step: loss must be a finite number"},
		// eval
		{"epoch negative", `{"event":"eval","run_id":"r","epoch":-1}`, ErrKindField, "eval: epoch must be a non-negative integer"},
		{"epoch fraction", `{"event":"eval","run_id":"r","epoch":1.5}`, ErrKindField, "eval: epoch must be a non-negative integer"},
		{"val_loss string", `{"event":"eval","run_id":"r","val_loss":"x"}`, ErrKindField, "eval: val_loss must be a finite number"},
		{"accuracy negative", `{"event":"eval","run_id":"r","accuracy":-1}`, ErrKindField, "eval: accuracy must be a finite non-negative number"},
		{"eval num_workers negative", `{"event":"eval","run_id":"r","num_workers":-1}`, ErrKindField, "eval: num_workers must be a non-negative integer"},
		{"eval prefetch alone", `{"event":"eval","run_id":"r","prefetch_factor":2}`, ErrKindField, "eval: prefetch_factor needs num_workers (the loader settings are reported together)"},
		// run_end
		{"status not string", `{"event":"run_end","run_id":"r","status":1}`, ErrKindField, "run_end: status must be a string"},
		{"status too long", `{"event":"run_end","run_id":"r","status":"` + long(1025) + `"}`, ErrKindField, "run_end: status too long: 1025 bytes > 1024"},
		// run_start
		{"model not string", `{"event":"run_start","run_id":"r","model":7}`, ErrKindField, "run_start: model must be a string"},
		{"notes too long", `{"event":"run_start","run_id":"r","notes":"` + long(1025) + `"}`, ErrKindField, "run_start: notes too long: 1025 bytes > 1024"},
		{"budget_scope not string", `{"event":"run_start","run_id":"r","budget_scope":{}}`, ErrKindField, "run_start: budget_scope must be a string"},
		{"batch_size negative", `{"event":"run_start","run_id":"r","batch_size":-8}`, ErrKindField, "run_start: batch_size must be a non-negative integer"},
		{"batch_size fraction", `{"event":"run_start","run_id":"r","batch_size":8.5}`, ErrKindField, "run_start: batch_size must be a non-negative integer"},
		{"seed fraction", `{"event":"run_start","run_id":"r","seed":4.2}`, ErrKindField, "run_start: seed must be an integer"},
		{"seed overflow", `{"event":"run_start","run_id":"r","seed":9223372036854775808}`, ErrKindField, "run_start: seed must be an integer"},
		{"num_workers string", `{"event":"run_start","run_id":"r","num_workers":"6"}`, ErrKindField, "run_start: num_workers must be a non-negative integer"},
		{"rank negative", `{"event":"run_start","run_id":"r","rank":-1}`, ErrKindField, "run_start: rank must be a non-negative integer"},
		{"warmup_s negative", `{"event":"run_start","run_id":"r","warmup_s":-60}`, ErrKindField, "run_start: warmup_s must be a finite non-negative number"},
		{"warmup_steps fraction", `{"event":"run_start","run_id":"r","warmup_steps":1.5}`, ErrKindField, "run_start: warmup_steps must be a non-negative integer"},
		{"planned_steps negative", `{"event":"run_start","run_id":"r","planned_steps":-1}`, ErrKindField, "run_start: planned_steps must be a non-negative integer"},
		{"params fraction", `{"event":"run_start","run_id":"r","params":1.5}`, ErrKindField, "run_start: params must be a non-negative integer"},
		{"planned_tokens negative", `{"event":"run_start","run_id":"r","planned_tokens":-5}`, ErrKindField, "run_start: planned_tokens must be a non-negative integer"},
		{"adjustment_interval zero", `{"event":"run_start","run_id":"r","adjustment_interval":0}`, ErrKindField, "run_start: adjustment_interval must be a positive number of steps"},
		{"target_gpu_utilization above 1", `{"event":"run_start","run_id":"r","target_gpu_utilization":85}`, ErrKindField, "run_start: target_gpu_utilization must be a fraction in (0, 1]"},
		{"max_ram_usage zero", `{"event":"run_start","run_id":"r","max_ram_usage":0}`, ErrKindField, "run_start: max_ram_usage must be a fraction in (0, 1]"},
		{"max_ram_usage string", `{"event":"run_start","run_id":"r","max_ram_usage":"0.8"}`, ErrKindField, "run_start: max_ram_usage must be a finite non-negative number"},
		{"price negative", `{"event":"run_start","run_id":"r","gpu_price_per_hour":-2.1}`, ErrKindField, "run_start: gpu_price_per_hour must be a finite non-negative number"},
		{"gpus not array", `{"event":"run_start","run_id":"r","gpus":"0,1"}`, ErrKindField, "run_start: gpus must be an array of GPU indices or UUIDs"},
		{"gpus negative", `{"event":"run_start","run_id":"r","gpus":[-1]}`, ErrKindField, "run_start: gpus must be an array of GPU indices or UUIDs"},
		{"gpus empty string", `{"event":"run_start","run_id":"r","gpus":[""]}`, ErrKindField, "run_start: gpus must be an array of GPU indices or UUIDs"},
		{"gpus object", `{"event":"run_start","run_id":"r","gpus":[{}]}`, ErrKindField, "run_start: gpus must be an array of GPU indices or UUIDs"},
		{"gpus too many", `{"event":"run_start","run_id":"r","gpus":[` + strings.TrimSuffix(strings.Repeat("0,", 65), ",") + `]}`, ErrKindField, "run_start: gpus has too many entries: 65 > 64"},
		{"cuda_visible_devices not string", `{"event":"run_start","run_id":"r","cuda_visible_devices":[0]}`, ErrKindField, "run_start: cuda_visible_devices must be a string"},
		{"label value too long", `{"event":"run_start","run_id":"r","team":"` + long(257) + `"}`, ErrKindField, `run_start: label "team" too long: 257 bytes > 256`},
		{"label key too long", `{"event":"run_start","run_id":"r","` + long(257) + `":1}`, ErrKindField, "run_start: label key too long: 257 bytes > 256"},
		{"label key unprintable", `{"event":"run_start","run_id":"r","a\tb":1}`, ErrKindField, "run_start: label keys must be non-empty printable UTF-8"},
		{"too many labels", manyLabels(65), ErrKindField, "run_start: too many extra keys: more than 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := Parse([]byte(tt.line))
			if err == nil {
				t.Fatalf("Parse succeeded: %#v", ev)
			}
			if ev != nil {
				t.Errorf("event %#v returned with error", ev)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not *Error", err)
			}
			if pe.Kind != tt.kind {
				t.Errorf("kind = %q, want %q (%v)", pe.Kind, tt.kind, err)
			}
			if p, ok := strings.CutSuffix(tt.msg, "…"); ok && !strings.HasSuffix(tt.msg, `…"`) {
				if !strings.HasPrefix(err.Error(), p) || len(err.Error()) <= len(p) {
					t.Errorf("error = %q, want prefix %q", err, p)
				}
			} else if err.Error() != tt.msg {
				t.Errorf("error = %q, want %q", err, tt.msg)
			}
		})
	}
}

func TestParseLabelsBound(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"event":"run_start","run_id":"r"`)
	for i := 0; i < MaxLabels; i++ {
		b.WriteString(`,"k` + strings.Repeat("x", i) + `":"` + strings.Repeat("v", MaxLabelBytes) + `"`)
	}
	b.WriteString(`,"ignored_obj":{"a":1},"ignored_null":null}`)
	ev, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ev.(*RunStart).Start.Labels); n != MaxLabels {
		t.Fatalf("labels = %d, want %d", n, MaxLabels)
	}
}

func TestParseDoesNotRetainInput(t *testing.T) {
	line := []byte(`{"event":"run_start","run_id":"abc","model":"m","team":"t","gpus":["GPU-x"]}`)
	ev, err := Parse(line)
	if err != nil {
		t.Fatal(err)
	}
	for i := range line {
		line[i] = 'Z'
	}
	rs := ev.(*RunStart)
	if rs.Run != "abc" || rs.Start.Metadata.Model != "m" || rs.Start.Labels["team"] != "t" || rs.GPUs[0] != "GPU-x" {
		t.Fatalf("event changed with input: %#v", rs)
	}
}

func TestOutboundLines(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{string(ErrorLine("step: tokens must be a non-negative integer", 3)),
			`{"event":"error","error":"step: tokens must be a non-negative integer","line":3}` + "\n"},
		{string(ErrorLine("too many connections", 0)), `{"event":"error","error":"too many connections"}` + "\n"},
		{string(ErrorLine(`unknown event "<a&b>"`, 1)), `{"event":"error","error":"unknown event \"<a&b>\"","line":1}` + "\n"},
		{string(ErrorLine("bad \xff", 2)), `{"event":"error","error":"bad \ufffd","line":2}` + "\n"},
		{string(AdviceLine("r1", &trainmeterv1.DataloaderAdvice{NumWorkers: 6, PrefetchFactor: 3, Reason: "data-bound", Classification: "data-bound", DataWaitShare: 0.5, GpuUtilization: 0.52, RamUsage: -1, ExpectedGain: 0.5, MaxWorkers: 15})),
			`{"event":"advice","run_id":"r1","kind":"dataloader","num_workers":6,"prefetch_factor":3,"reason":"data-bound","classification":"data-bound","data_wait_share":0.5,"gpu_utilization":0.52,"expected_gain":0.5,"max_workers":15}` + "\n"},
		{string(AdviceLine("r1", &trainmeterv1.DataloaderAdvice{NumWorkers: 0, PrefetchFactor: 1, Reason: "memory-bound", Classification: "memory-bound", RamUsage: 0.9, GpuUtilization: -1, FromNumWorkers: 1, FromPrefetchFactor: 1})),
			`{"event":"advice","run_id":"r1","kind":"dataloader","num_workers":0,"prefetch_factor":1,"reason":"memory-bound","classification":"memory-bound","data_wait_share":0,"ram_usage":0.9,"expected_gain":0,"from_num_workers":1,"from_prefetch_factor":1}` + "\n"},
		{string(StopLine("r1", "budget llama-3-8b exceeded (100%)")),
			`{"event":"stop","run_id":"r1","reason":"budget llama-3-8b exceeded (100%)"}` + "\n"},
		{string(StopLine("r\n1", "")), `{"event":"stop","run_id":"r\n1"}` + "\n"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got  %q\nwant %q", tt.got, tt.want)
		}
		if strings.Count(tt.got, "\n") != 1 {
			t.Errorf("%q is not exactly one line", tt.got)
		}
	}
}

// TestParsePlanKey: run_start's plan_key is the run's plan key, never a
// label (labels show in reports; the key must not).
func TestParsePlanKey(t *testing.T) {
	ev, err := Parse([]byte(`{"event":"run_start","run_id":"r","plan_key":"0123456789abcdef0123456789abcdef","team":"nlp"}`))
	if err != nil {
		t.Fatal(err)
	}
	rs := ev.(*RunStart)
	if rs.Start.PlanKey != "0123456789abcdef0123456789abcdef" {
		t.Errorf("plan key %q", rs.Start.PlanKey)
	}
	if _, ok := rs.Start.Labels["plan_key"]; ok || rs.Start.Labels["team"] != "nlp" {
		t.Errorf("labels %v: want team only", rs.Start.Labels)
	}
}
