package aggregate

import (
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// fill sets every field of m to a distinct non-zero value (maps and lists
// get two entries), so a field the store drops shows up.
func fill(m protoreflect.Message, n *int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range 2 {
				mp.Set(scalar(fd.MapKey(), n).MapKey(), element(mp.NewValue, fd.MapValue(), n))
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				l.Append(element(l.NewElement, fd, n))
			}
		case fd.Message() != nil:
			fill(m.Mutable(fd).Message(), n)
		default:
			m.Set(fd, scalar(fd, n))
		}
	}
}

func element(newValue func() protoreflect.Value, fd protoreflect.FieldDescriptor, n *int) protoreflect.Value {
	if fd.Message() != nil {
		v := newValue()
		fill(v.Message(), n)
		return v
	}
	return scalar(fd, n)
}

func scalar(fd protoreflect.FieldDescriptor, n *int) protoreflect.Value {
	*n++
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(*n))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(*n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(*n))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(*n))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(*n) + 0.25)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("s%d", *n))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Number())
	}
	panic("fill: add a case for " + fd.Kind().String())
}

// filled is a state with every field set.
func filled() *State {
	s := New("")
	n := 0
	fill(s.ProtoReflect(), &n)
	s.NodesApart = false
	return s
}

func TestCodecKeepsEveryField(t *testing.T) {
	s := filled()
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameFigures(got, s) {
		t.Fatalf("round trip lost something\n got %v\nwant %v", got.Aggregate, s.Aggregate)
	}
	if _, err := Unmarshal([]byte{0xff, 0xff, 0xff}); err == nil {
		t.Error("garbage decoded without an error")
	}
}

// sameFigures compares two states without the store's bookkeeping.
func sameFigures(a, b *State) bool {
	x, y := proto.Clone(a.Aggregate).(*storev1.Aggregate), proto.Clone(b.Aggregate).(*storev1.Aggregate)
	x.NodesApart, y.NodesApart = false, false
	return proto.Equal(x, y)
}

func TestCodecWithNodesApartKeepsEveryField(t *testing.T) {
	s := filled()
	header, err := s.MarshalApart()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(header)
	if err != nil {
		t.Fatal(err)
	}
	if !got.GetNodesApart() || len(got.Nodes) != 0 {
		t.Fatalf("header: apart %v, %d nodes inside", got.GetNodesApart(), len(got.Nodes))
	}
	if ch := got.TakeChangedNodes(); len(ch) != 0 {
		t.Fatalf("a state just read has changed nodes %v", ch)
	}
	for name := range s.Nodes {
		b, err := s.MarshalNode(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := got.UnmarshalNode(name, b); err != nil {
			t.Fatal(err)
		}
	}
	if !sameFigures(got, s) {
		t.Fatal("header + nodes do not decode to what was written")
	}
	if ch := got.TakeChangedNodes(); len(ch) != 0 {
		t.Fatalf("nodes read back count as changed: %v", ch)
	}
	if _, err := s.MarshalNode("nobody"); err == nil {
		t.Error("MarshalNode of an unknown node gave no error")
	}
	if err := got.UnmarshalNode("x", []byte{0xff, 0xff}); err == nil {
		t.Error("a garbled node decoded without an error")
	}
}

// Every change to a node's state is reported once by TakeChangedNodes, and a
// state read from an encoding with its nodes inside reports all of them.
func TestChangedNodesAreTakenOnce(t *testing.T) {
	s := New("r1")
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
	s.AddStart("b", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
	if got := s.TakeChangedNodes(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("after two starts: %v", got)
	}
	if got := s.TakeChangedNodes(); len(got) != 0 {
		t.Fatalf("taken twice: %v", got)
	}
	for sec := range PeakHorizon + 5 {
		s.AddWindow("a", win("a", float64(sec), float64(sec)+1, true, 1, 1, 300, 1, 0).w)
	}
	if got := s.TakeChangedNodes(); !reflect.DeepEqual(got, []string{"a"}) {
		t.Fatalf("after a's windows: %v", got)
	}
	// b's windows let a's oldest buckets fold: both nodes' columns change.
	for sec := range PeakHorizon + 5 {
		s.AddWindow("b", win("b", float64(sec), float64(sec)+1, true, 1, 1, 300, 1, 0).w)
	}
	if got := s.TakeChangedNodes(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("after b's windows folded buckets of both: %v", got)
	}
	full, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(full)
	if err != nil {
		t.Fatal(err)
	}
	if back.GetNodesApart() {
		t.Fatal("a full encoding read back as apart")
	}
	if got := back.TakeChangedNodes(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("a state read with its nodes inside: %v, want every node", got)
	}
}
