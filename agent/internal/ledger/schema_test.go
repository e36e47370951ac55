package ledger

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/trainerwire"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The proto is the schema of a run's metadata: a field added to
// RunMetadata (or to RunStart, not set by the agent) in ingest.proto is a
// run_start key (trainerwire), decoded by its kind (trainerproto), passed
// on in the agent's RunStart and filled from a joining client (fill.go),
// with no code of its own. These tests walk every such field, so a new one
// is checked with no change here.

// metadataLine is a run_start line with a distinct value for every metadata
// key, and the Start those values make.
func metadataLine(t *testing.T, run string) ([]byte, *trainmeterv1.RunStart) {
	t.Helper()
	line := map[string]any{"event": "run_start", "run_id": run}
	want := &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{}}
	for i, fd := range trainerwire.MetadataFields() {
		var j any
		var v protoreflect.Value
		n := i + 1
		switch fd.Kind() {
		case protoreflect.StringKind:
			j, v = "v-"+string(fd.Name()), protoreflect.ValueOfString("v-"+string(fd.Name()))
		case protoreflect.BoolKind:
			j, v = true, protoreflect.ValueOfBool(true)
		case protoreflect.DoubleKind: // a fraction in (0, 1], as some must be
			j, v = 1/float64(n+1), protoreflect.ValueOfFloat64(1/float64(n+1))
		case protoreflect.Int64Kind:
			j, v = n, protoreflect.ValueOfInt64(int64(n))
		case protoreflect.Uint64Kind:
			j, v = n, protoreflect.ValueOfUint64(uint64(n))
		case protoreflect.Uint32Kind:
			j, v = n, protoreflect.ValueOfUint32(uint32(n))
		default:
			t.Fatalf("%s: no test value for a %s field", fd.Name(), fd.Kind())
		}
		line[string(fd.Name())] = j
		trainerwire.Holder(want, fd).Set(fd, v)
	}
	b, err := json.Marshal(line)
	if err != nil {
		t.Fatal(err)
	}
	return b, want
}

func parseStart(t *testing.T, line []byte) *trainerproto.RunStart {
	t.Helper()
	ev, err := trainerproto.Parse(line)
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return ev.(*trainerproto.RunStart)
}

// sameMetadata reports each metadata field in which got differs from want.
func sameMetadata(t *testing.T, what string, got, want *trainmeterv1.RunStart) {
	t.Helper()
	for _, fd := range trainerwire.MetadataFields() {
		g, w := trainerwire.Holder(got, fd), trainerwire.Holder(want, fd)
		if g.Has(fd) != w.Has(fd) || !g.Get(fd).Equal(w.Get(fd)) {
			t.Errorf("%s: %s = %v (set %v), want %v", what, fd.Name(), g.Get(fd), g.Has(fd), w.Get(fd))
		}
	}
	if len(got.Labels) != 0 {
		t.Errorf("%s: labels %v: a metadata key became a label", what, got.Labels)
	}
}

func runStarts(r *rig) []*trainmeterv1.RunStart {
	var out []*trainmeterv1.RunStart
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if s := e.GetRunStart(); s != nil {
				out = append(out, s)
			}
		}
	}
	return out
}

// Every metadata field goes from the trainer's line to the agent's
// RunStart as sent.
func TestEveryMetadataFieldRoundTrips(t *testing.T) {
	line, want := metadataLine(t, "rt")
	r := newRig(t, []float64{100}, []float64{100}, 0)
	r.advance(time.Second)
	if err := r.l.StartRun(r.now, peer1, parseStart(t, line)); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	starts := runStarts(r)
	if len(starts) != 1 {
		t.Fatalf("%d run_start events, want 1", len(starts))
	}
	sameMetadata(t, "start", starts[0], want)
}

// A run of `trainmeter run` that names no metadata takes every field from
// the first joining client that does.
func TestEveryMetadataFieldIsFilledByTheJoiningClient(t *testing.T) {
	line, want := metadataLine(t, "a")
	r := attributedRig(t, false)
	r.advance(time.Second)
	wrapper := parseStart(t, []byte(`{"event":"run_start","run_id":"a","attribute_pid":9,"client_id":"tm-run"}`))
	if err := r.l.StartRun(r.now, peer1, wrapper); err != nil {
		t.Fatal(err)
	}
	if err := r.l.StartRun(r.now, Peer{ConnID: 2, PID: 101, UID: 1000}, parseStart(t, line)); err != nil {
		t.Fatalf("join: %v", err)
	}
	// The same client again, every identifying field changed: each is a
	// conflict, and the run keeps what it has.
	changed := parseStart(t, line)
	changed.Start.Metadata = &trainmeterv1.RunMetadata{}
	for _, fd := range trainerwire.MetadataFields() {
		if identifies(fd) {
			g := trainerwire.Holder(want, fd).Get(fd)
			switch fd.Kind() {
			case protoreflect.StringKind:
				g = protoreflect.ValueOfString(g.String() + "-other")
			case protoreflect.Int64Kind:
				g = protoreflect.ValueOfInt64(g.Int() + 100)
			case protoreflect.Uint64Kind:
				g = protoreflect.ValueOfUint64(g.Uint() + 100)
			case protoreflect.Uint32Kind:
				g = protoreflect.ValueOfUint32(uint32(g.Uint() + 100))
			case protoreflect.DoubleKind:
				g = protoreflect.ValueOfFloat64(g.Float() / 2)
			case protoreflect.BoolKind:
				g = protoreflect.ValueOfBool(!g.Bool())
			}
			trainerwire.Holder(changed.Start, fd).Set(fd, g)
		}
	}
	err := r.l.StartRun(r.now, Peer{ConnID: 3, PID: 102, UID: 1000}, changed)
	var mc *MetadataConflict
	if !errors.As(err, &mc) {
		t.Fatalf("changed join: err %v, want a MetadataConflict", err)
	}
	n := 0
	for _, fd := range trainerwire.MetadataFields() {
		if identifies(fd) {
			n++
		}
	}
	if len(mc.Fields) != n {
		t.Errorf("conflicts %q, want one per identifying field (%d)", mc.Fields, n)
	}
	r.advance(2 * time.Second)
	starts := runStarts(r)
	if len(starts) != 2 {
		t.Fatalf("%d run_start events, want the start and its filled copy", len(starts))
	}
	sameMetadata(t, "filled copy", starts[1], want)
}
