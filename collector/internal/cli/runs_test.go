package cli

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/protojsonout"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// labelledCollector is liveCollector plus run-c: model llama-3-8b, labels
// team=nlp and env=ci, started 10 s after the others.
func labelledCollector(t *testing.T) string {
	t.Helper()
	addr := liveCollector(t)
	a := tu.Connect(t, tu.Dial(t, addr), "gpu-box-2", "boot")
	st := tu.Start("run-c", 10, "llama-3-8b")
	st.GetRunStart().Labels = map[string]string{"team": "nlp", "env": "ci"}
	st.GetRunStart().BudgetScope = "nlp-q4"
	a.MustAck(tu.Batch(1, 10, []*trainmeterv1.RunWindow{tu.Window("run-c", 10, 100, 50)}, st))
	return addr
}

func runIDsOf(t *testing.T, out string) []string {
	t.Helper()
	var resp struct {
		Runs []struct {
			RunID string `json:"run_id"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("runs --json is not JSON: %v\n%s", err, out)
	}
	var ids []string
	for _, r := range resp.Runs {
		ids = append(ids, r.RunID)
	}
	return ids
}

func TestRunsJSONAndFilters(t *testing.T) {
	env := map[string]string{EnvCollector: labelledCollector(t)}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "run-a run-b run-c"},
		{[]string{"--model", "llama-3-8b"}, "run-a run-c"},
		{[]string{"--status", "running"}, "run-b run-c"},
		{[]string{"--status", "ended"}, "run-a"},
		{[]string{"--label", "team=nlp"}, "run-c"},
		{[]string{"--label", "team=nlp", "--label", "env=prod"}, ""},
		{[]string{"--label", "team=nlp", "--model", "tiny"}, ""},
		{[]string{"--since", "2025-03-01T12:00:05Z"}, "run-c"},
		{[]string{"--since", "2025-03-01"}, "run-a run-b run-c"},
		{[]string{"--since", "1h"}, ""}, // the runs are from 2025
	} {
		out, err := run(t, env, append([]string{"runs", "--json"}, c.args...)...)
		if err != nil {
			t.Fatalf("runs --json %v: %v", c.args, err)
		}
		if got := strings.Join(runIDsOf(t, out), " "); got != c.want {
			t.Errorf("runs --json %v: %q, want %q", c.args, got, c.want)
		}
	}
	// The JSON carries what the table cannot: labels, budget scope, numbers.
	out, err := run(t, env, "runs", "--json", "--label", "env=ci")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"labels": {`, `"team": "nlp"`, `"budget_scope": "nlp-q4"`, `"tokens_processed": 100,`} {
		if !strings.Contains(out, want) {
			t.Errorf("runs --json lacks %s:\n%s", want, out)
		}
	}

	out, err = run(t, env, "runs", "--model", "llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^RUN +MODEL +BACKEND +STATUS +START +WALL`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^run-a +llama-3-8b +torch +ended +2025-03-01T12:00:00Z +2s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^run-c +llama-3-8b +torch +running +2025-03-01T12:00:10Z`).MatchString(out) || strings.Contains(out, "run-b") {
		t.Errorf("runs --model table:\n%s", out)
	}
	if out, err := run(t, env, "runs", "--model", "nope"); err != nil || out != "no runs match the filters (3 runs stored)\n" {
		t.Errorf("no match: %q %v", out, err)
	}
	for _, c := range []struct{ args, want string }{
		{"--status done", `--status "done": want running, ended, failed, or an end status`},
		{"--since yesterday", `--since "yesterday": want a duration back from now (24h, 90m, 7d) or a time`},
		{"--label team", `--label "team": want KEY=VALUE`},
		{"--label =x", `--label "=x": want KEY=VALUE`},
	} {
		if _, err := run(t, env, append([]string{"runs"}, strings.Fields(c.args)...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("runs %s: %v, want %q", c.args, err, c.want)
		}
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2025, 3, 10, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                          {},
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        now.Add(-7 * 24 * time.Hour),
		"1.5d":                      now.Add(-36 * time.Hour),
		"2025-03-01":                time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC),
		"2025-03-01T12:30:00":       time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC),
		"2025-03-01T12:30:00Z":      time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC),
		"2025-03-01T14:30:00+02:00": time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC),
	} {
		got, err := parseWhen("since", in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1h", "-2d", "soon", "2025-13-01"} {
		if _, err := parseWhen("since", bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestNodesJSON(t *testing.T) {
	env := map[string]string{EnvCollector: labelledCollector(t)}
	out, err := run(t, env, "nodes", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Nodes []struct {
			Node      string `json:"node"`
			LastSeq   any    `json:"last_seq"`
			Connected bool   `json:"connected"`
			Gpus      []any  `json:"gpus"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(resp.Nodes) != 2 || resp.Nodes[0].Node != "gpu-box-1" || resp.Nodes[1].Node != "gpu-box-2" {
		t.Fatalf("nodes --json:\n%s", out)
	}
	if n, ok := resp.Nodes[0].LastSeq.(float64); !ok || n != 3 {
		t.Errorf("last_seq %#v, want the number 3", resp.Nodes[0].LastSeq)
	}
}

// TestReportJSONNumbers: every number of report --json is a JSON number
// (protojson writes 64-bit integers as strings), checked field by field
// against the RunReport message.
func TestReportJSONNumbers(t *testing.T) {
	env := map[string]string{EnvCollector: labelledCollector(t)}
	out, err := run(t, env, "report", "run-a", "--json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	checkNumbers(t, "", (&trainmeterv1.RunReport{}).ProtoReflect().Descriptor(), obj)
	if obj["tokens_processed"] != json.Number("4096") || obj["steps"] != json.Number("2") || obj["gpus"] != json.Number("1") {
		t.Errorf("tokens_processed %v steps %v gpus %v", obj["tokens_processed"], obj["steps"], obj["gpus"])
	}
	// Field order is the .proto's, as before.
	if i, j := strings.Index(out, `"run_id"`), strings.Index(out, `"tokens_processed"`); i < 0 || j < i {
		t.Errorf("fields out of order:\n%s", out)
	}
}

func checkNumbers(t *testing.T, path string, md protoreflect.MessageDescriptor, obj map[string]any) {
	t.Helper()
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := path + string(fd.Name())
		v, ok := obj[string(fd.Name())]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if v == nil {
			continue // an unset optional figure: null
		}
		var vals []any
		switch {
		case fd.IsList():
			vals = v.([]any)
		case fd.IsMap():
			continue // string to string
		default:
			vals = []any{v}
		}
		for _, e := range vals {
			switch fd.Kind() {
			case protoreflect.MessageKind:
				if m, ok := e.(map[string]any); ok {
					checkNumbers(t, name+".", fd.Message(), m)
				}
			case protoreflect.StringKind, protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.BytesKind:
			default:
				if _, ok := e.(json.Number); !ok {
					t.Errorf("%s = %#v: not a JSON number", name, e)
				}
			}
		}
	}
}

func TestProtoJSONNumbersNestedAndNonFinite(t *testing.T) {
	nan := math.NaN()
	r := &trainmeterv1.RunReport{RunId: "r", TokensProcessed: 1 << 60, AvgPowerW: proto.Float64(math.Inf(1)), Mfu: &nan,
		Evals: []*trainmeterv1.Eval{{RunId: "r", Epoch: proto.Int64(3)}}}
	b, err := protojsonout.Indented(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"tokens_processed": 1152921504606846976,`, `"avg_power_w": null,`, `"mfu": null`, `"epoch": 3,`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("lacks %s:\n%s", want, b)
		}
	}
}

// "1 evaluation", not "1 evaluations": counts in human output agree with
// their nouns.
func TestCountsAgreeWithTheirNouns(t *testing.T) {
	var b bytes.Buffer
	writeRecommendations(&b, &trainmeterv1.RecommendResponse{Recommendations: []*trainmeterv1.Recommendation{{Kind: "power", Title: "t", RunIds: []string{"r"}}}}, 0)
	if !strings.Contains(b.String(), "(1 recommendation; ") {
		t.Errorf("one recommendation:\n%s", b.String())
	}
}
