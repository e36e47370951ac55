package ledger

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/pkg/trainerwire"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A run started by `trainmeter run` (attribute_pid) carries only the
// metadata given on its command line; the script it wraps usually knows
// more (its client sends model, batch size, params, ...). The first joining
// client that names a field the wrapper left out fills it, so the run's
// summaries, budgets per model and forecasts see it. Where both name a field
// differently the command line wins: the join is still accepted (its tokens
// count), and both sides are told.

// MetadataConflict is returned by StartRun when a client joined a run
// started by `trainmeter run` whose command line set some fields
// differently. The join took effect; Error is what the joining client is
// told, StarterMessage what the wrapper (connection StarterConn) is told.
type MetadataConflict struct {
	Run          string
	StarterConn  uint64
	StarterFound bool     // false when the wrapper's connection is gone
	Fields       []string // `model "b" (kept "a")`, one per conflicting field
}

func (c *MetadataConflict) Error() string {
	return fmt.Sprintf("run_start: joined run %q, which keeps the values of trainmeter run's command line where this script's differ: %s",
		c.Run, strings.Join(c.Fields, ", "))
}

// StarterMessage is the conflict as `trainmeter run` shows it on stderr.
func (c *MetadataConflict) StarterMessage() string {
	return fmt.Sprintf("the command's client sent metadata that differs from this command line: %s; the run keeps the command line's values (leave those flags out to use the script's)",
		strings.Join(c.Fields, ", "))
}

// fillFrom fills the metadata fields (trainerwire.MetadataFields) and
// labels of dst (the run's merged run_start) that are unset from ev's, and
// returns whether anything was filled and the conflicts: identifying
// fields both set to different values (dst's are kept). For the others
// (notes, seed, plan, labels, ...) dst's value is kept silently.
func fillFrom(dst, ev *trainmeterv1.RunStart) (filled bool, conflicts []string) {
	for _, fd := range trainerwire.MetadataFields() {
		d, e := trainerwire.Holder(dst, fd), trainerwire.Holder(ev, fd)
		switch {
		case !e.Has(fd):
		case !d.Has(fd):
			d.Set(fd, e.Get(fd))
			filled = true
		case identifies(fd) && !d.Get(fd).Equal(e.Get(fd)):
			conflicts = append(conflicts, fmt.Sprintf("%s %s (kept %s)", fd.Name(), show(e.Get(fd)), show(d.Get(fd))))
		}
	}
	for k, v := range ev.GetLabels() {
		if _, have := dst.Labels[k]; !have {
			if dst.Labels == nil {
				dst.Labels = map[string]string{}
			}
			dst.Labels[k], filled = v, true
		}
	}
	return filled, conflicts
}

// conflict reports the first identifying field that both the run's
// metadata and a joining run_start's set, to different values. Fields
// either side leaves out never conflict.
func conflict(have, got *trainmeterv1.RunMetadata) error {
	h, g := have.ProtoReflect(), got.ProtoReflect()
	for _, fd := range trainerwire.MetadataFields() {
		if identifies(fd) && h.Has(fd) && g.Has(fd) && !h.Get(fd).Equal(g.Get(fd)) {
			return fmt.Errorf("%s %s != %s", fd.Name(), show(g.Get(fd)), show(h.Get(fd)))
		}
	}
	return nil
}

// notIdentifying are the RunMetadata fields in which the ranks of one run
// may differ (seed, notes); every other RunMetadata field identifies the
// run (model, batch size, ...), and no RunStart field does.
var notIdentifying = []protoreflect.Name{"seed", "notes"}

func identifies(fd protoreflect.FieldDescriptor) bool {
	return fd.ContainingMessage().Name() == "RunMetadata" && !slices.Contains(notIdentifying, fd.Name())
}

// show is v as a conflict names it: strings quoted, numbers as they are.
func show(v protoreflect.Value) string {
	if s, ok := v.Interface().(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v.Interface())
}

// startOf is a copy of ev's start (the trainer's metadata and labels), with
// its metadata, never nil, so the agent may fill it.
func startOf(ev *trainerproto.RunStart) *trainmeterv1.RunStart {
	rs := &trainmeterv1.RunStart{}
	if ev.Start != nil {
		rs = proto.CloneOf(ev.Start)
	}
	if rs.Metadata == nil {
		rs.Metadata = &trainmeterv1.RunMetadata{}
	}
	return rs
}

// starterCopy is the run_start a run started by `trainmeter run` keeps to
// fill: a copy, so filling never touches the event the caller passed.
func starterCopy(ev *trainerproto.RunStart) *trainerproto.RunStart {
	cp := *ev
	cp.Start = startOf(ev)
	return &cp
}

// starterConn is the connection of the member that started the run (the
// wrapper, possibly reconnected), or false when it is gone.
func (r *run) starterConn() (uint64, bool) {
	for c, key := range r.members {
		if key == r.starterKey {
			return c, true
		}
	}
	return 0, false
}
