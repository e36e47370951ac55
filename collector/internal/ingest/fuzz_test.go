package ingest

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// seedBatches are the fuzz seeds: valid batches from the test builders and
// malformed ones. The committed corpus (testdata/fuzz/FuzzValidateBatch and
// FuzzAggregate) holds the same; TRAINMETER_WRITE_CORPUS=1 go test -run
// TestWriteFuzzCorpus ./collector/internal/ingest rewrites it.
func seedBatches() map[string]*trainmeterv1.Batch {
	eval := &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: "r1", Time: tu.TS(1.5), ValLoss: proto.Float64(1.9)}}}
	warm := tu.Window("r1", 0, 100, 50)
	warm.Phase, warm.TokensMeasured = trainmeterv1.Phase_PHASE_WARMUP, 0
	seeds := map[string]*trainmeterv1.Batch{
		"valid_start":      tu.Batch(1, 0, []*trainmeterv1.RunWindow{warm}, tu.Start("r1", 0, "llama")),
		"valid_steps":      tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("r1", 1, 65536, 300), tu.Window("r2", 1, 7, 1)}, eval),
		"valid_end":        tu.Batch(3, 2, []*trainmeterv1.RunWindow{tu.Window("r1", 2, 1, 299.5)}, tu.End("r1", 2.5)),
		"valid_empty":      tu.Batch(4, 3, nil),
		"valid_two_starts": tu.Batch(5, 4, nil, tu.Start("a", 4, "m"), tu.Start("b", 4.2, "m2")),
	}
	// Loss records of dropped batches: a run's (with its host energy) and
	// the node's (with the idle parts), one of them in doubt.
	lost := tu.Batch(6, 5, []*trainmeterv1.RunWindow{tu.Window("r1", 5, 10, 20)})
	lost.Losses = []*trainmeterv1.DataLoss{{RunId: "r1", Batches: 2, Tokens: 100, EnergyJ: 500, GpuSeconds: 2, HostEnergyJ: 80, Reason: "spool full"}}
	lost.NodeLosses = []*trainmeterv1.DataLoss{
		{Batches: 2, EnergyJ: 700, IdleEnergyJ: 200, GpuSeconds: 4, IdleGpuSeconds: 2, HostEnergyJ: 120, IdleHostEnergyJ: 40, Reason: "spool full", FirstWindowStart: tu.TS(2)},
		{Batches: 1, EnergyJ: 300, GpuSeconds: 2, Reason: "spool full", Seq: 4, WindowStart: tu.TS(3)},
	}
	seeds["valid_losses"] = lost
	for name, b := range tu.Invalid(9) {
		seeds["invalid_"+name] = b
	}
	for _, r := range malformed(9) {
		if len(r.name) < 40 && r.name != "10001 gpu windows" {
			seeds["invalid_"+r.name] = r.b
		}
	}
	return seeds
}

func addSeeds(f *testing.F) {
	for _, b := range seedBatches() {
		raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
		if err != nil {
			continue // invalid UTF-8 in a string does not marshal
		}
		f.Add(raw)
	}
}

// FuzzValidateBatch: whatever bytes an agent sends, unmarshalling and
// validating never panic; a valid batch stays valid after a round trip
// through the wire format; the time check never panics either.
func FuzzValidateBatch(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b trainmeterv1.Batch
		if proto.Unmarshal(raw, &b) != nil {
			return
		}
		err := ValidateBatch(&b)
		_ = CheckBatchTime(&b, tu.Now())
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty reject reason")
			}
			return
		}
		again, merr := proto.Marshal(&b)
		if merr != nil {
			t.Fatalf("valid batch does not marshal: %v", merr)
		}
		var b2 trainmeterv1.Batch
		if err := proto.Unmarshal(again, &b2); err != nil {
			t.Fatalf("re-marshalled valid batch does not unmarshal: %v", err)
		}
		if err := ValidateBatch(&b2); err != nil {
			t.Fatalf("valid batch invalid after a round trip: %v", err)
		}
	})
}

// FuzzAggregate folds every valid batch it is given (three times, from two
// nodes, as re-sends and multi-node runs do) into run aggregates: the
// reports must have no NaN or Inf, the figures that cannot be negative are
// not, and the state must come back from its encoding giving the same
// report (a state that cannot be stored would stall the agent's stream
// forever; one that changes on the way would change the run's figures at
// every commit).
func FuzzAggregate(f *testing.F) {
	addSeeds(f)
	tariff, err := cost.ParseTariff([]byte(`{zone: Europe/Berlin, default: peak, bands: {peak: 0.3, off: 0.1}, rules: [{days: [weekdays], from: "22:00", to: "06:00", band: off}]}`))
	if err != nil {
		f.Fatal(err)
	}
	// Carbon by the hour: node-0 in a zone of the file, node-1 in none
	// (its energy at the flat fallback).
	carbon, err := cost.ParseCarbonFile([]byte(`{zones: {DE: {timezone: Europe/Berlin, default: 380, rules: [{days: [weekdays], from: "11:00", to: "16:00", gco2_kwh: 240}]}}}`))
	if err != nil {
		f.Fatal(err)
	}
	pricing := aggregate.Pricing{GPUPricePerHour: 2.5, Tariff: tariff, GridGCO2PerKWh: 400,
		PriorityMultipliers: map[string]float64{"high": 1.5},
		Carbon:              cost.CarbonChain{carbon}, CarbonFile: carbon, CarbonNodeZones: map[string]string{"node-0": "DE"}}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b trainmeterv1.Batch
		if proto.Unmarshal(raw, &b) != nil || ValidateBatch(&b) != nil {
			return
		}
		states := map[string]*aggregate.State{}
		state := func(id string) *aggregate.State {
			if states[id] == nil {
				states[id] = aggregate.New(id)
			}
			return states[id]
		}
		for rep := 0; rep < 3; rep++ {
			node := fmt.Sprintf("node-%d", rep%2)
			for _, e := range b.GetRunEvents() {
				switch ev := e.GetEvent().(type) {
				case *trainmeterv1.RunEvent_RunStart:
					state(ev.RunStart.GetRunId()).AddStart(node, ev.RunStart)
				case *trainmeterv1.RunEvent_RunEnd:
					state(ev.RunEnd.GetRunId()).AddEnd(node, ev.RunEnd)
				case *trainmeterv1.RunEvent_Eval:
					state(ev.Eval.GetRunId()).AddEval(node, ev.Eval)
				}
			}
			for _, w := range b.GetRunWindows() {
				state(w.GetRunId()).AddWindowBooked(node, w, tariff, pricing)
			}
		}
		for id, s := range states {
			before := s.Report(pricing)
			checkReport(t, id, before)
			enc, err := s.Marshal()
			if err != nil {
				t.Fatalf("run %q: state does not serialise: %v", id, err)
			}
			back, err := aggregate.Unmarshal(enc)
			if err != nil {
				t.Fatalf("run %q: state does not deserialise: %v", id, err)
			}
			if after := back.Report(pricing); !proto.Equal(before, after) {
				t.Fatalf("run %q: the report changed through the state's encoding\nbefore %v\nafter  %v", id, before, after)
			}
		}
	})
}

// mayBeNegative are the report's figures that can legitimately be < 0.
var mayBeNegative = map[protoreflect.Name]bool{"energy_disagreement_pct": true, "last_loss": true, "val_loss": true}

func checkReport(t *testing.T, id string, r *trainmeterv1.RunReport) {
	t.Helper()
	var walk func(path string, m protoreflect.Message)
	walk = func(path string, m protoreflect.Message) {
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			name := path + string(fd.Name())
			switch {
			case fd.Kind() == protoreflect.MessageKind && fd.IsList():
				for i := 0; i < v.List().Len(); i++ {
					walk(fmt.Sprintf("%s[%d].", name, i), v.List().Get(i).Message())
				}
			case fd.Kind() == protoreflect.MessageKind && !fd.IsMap():
				walk(name+".", v.Message())
			case fd.Kind() == protoreflect.DoubleKind && !fd.IsList() && !fd.IsMap():
				x := v.Float()
				if math.IsNaN(x) || math.IsInf(x, 0) {
					t.Fatalf("run %q: %s = %v", id, name, x)
				}
				if x < 0 && !mayBeNegative[fd.Name()] {
					t.Fatalf("run %q: %s = %v is negative", id, name, x)
				}
			}
			return true
		})
	}
	walk("", r.ProtoReflect())
}

// TestWriteFuzzCorpus rewrites the committed seed corpus from seedBatches
// (only with TRAINMETER_WRITE_CORPUS=1).
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("TRAINMETER_WRITE_CORPUS") != "1" {
		t.Skip("set TRAINMETER_WRITE_CORPUS=1 to rewrite testdata/fuzz")
	}
	for name, b := range seedBatches() {
		raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
		if err != nil {
			continue // invalid UTF-8 does not marshal; the fuzzer reaches it from the rest
		}
		file := ""
		for _, c := range name {
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
				file += string(c)
			default:
				file += "_"
			}
		}
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", raw)
		for _, dir := range []string{"FuzzValidateBatch", "FuzzAggregate"} {
			if err := os.WriteFile(filepath.Join("testdata", "fuzz", dir, file), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
