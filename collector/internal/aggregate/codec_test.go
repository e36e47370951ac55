package aggregate

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// fill sets every field reachable from v to a distinct non-zero value (maps
// and slices get two entries), so a field the codec forgets shows up.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		v.SetUint(uint64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), n)
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() { // the rest is bookkeeping, not stored as such
				fill(v.Field(i), n)
			}
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), n)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k := reflect.New(v.Type().Key()).Elem()
			fill(k, n)
			e := reflect.New(v.Type().Elem()).Elem()
			fill(e, n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		panic("fill: add a case for " + v.Kind().String())
	}
}

func TestCodecKeepsEveryField(t *testing.T) {
	var s State
	n := 0
	fill(reflect.ValueOf(&s).Elem(), &n)
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameFigures(got, &s) {
		gj, _ := json.Marshal(got)
		wj, _ := json.Marshal(&s)
		t.Fatalf("round trip lost something (a State field missing from codec.go or aggregate.proto?)\n got %s\nwant %s", gj, wj)
	}
}

// sameFigures compares two states without the store's bookkeeping.
func sameFigures(a, b *State) bool {
	x, y := *a, *b
	x.nodesApart, x.changed, y.nodesApart, y.changed = false, nil, false, nil
	return reflect.DeepEqual(&x, &y)
}

func TestCodecWithNodesApartKeepsEveryField(t *testing.T) {
	var s State
	n := 0
	fill(reflect.ValueOf(&s).Elem(), &n)
	for name := range s.Nodes {
		s.GPUs[name] = []uint32{1, 3} // a node's GPUs travel with the node
	}
	header, err := s.MarshalApart()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(header)
	if err != nil {
		t.Fatal(err)
	}
	if !got.NodesApart() || len(got.Nodes) != 0 {
		t.Fatalf("header: apart %v, %d nodes inside", got.NodesApart(), len(got.Nodes))
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
	if !sameFigures(got, &s) {
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
	if back.NodesApart() {
		t.Fatal("a full encoding read back as apart")
	}
	if got := back.TakeChangedNodes(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Fatalf("a state read with its nodes inside: %v, want every node", got)
	}
}

func TestJSONAggregatesOfEarlierVersionsStillRead(t *testing.T) {
	var s State
	n := 0
	fill(reflect.ValueOf(&s).Elem(), &n)
	legacy, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(legacy)
	if err != nil {
		t.Fatal(err)
	}
	if !sameFigures(got, &s) {
		t.Fatal("a JSON aggregate does not decode to what was written")
	}
	if _, err := Unmarshal([]byte("{not json")); err == nil {
		t.Error("broken JSON decoded without an error")
	}
	if _, err := Unmarshal([]byte{0xff, 0xff, 0xff}); err == nil {
		t.Error("garbage decoded without an error")
	}
}

func TestJSONPeakBucketsOfEarlierVersionsBecomeNodeColumns(t *testing.T) {
	old := `{"run_id":"r1","nodes":{"a":{"started":true,"has_window":true,"watermark":12},"b":{"has_window":true,"watermark":11}},
		"peak_folded":300,"max_bucket":12,"has_max_bucket":true,
		"peak_buckets":{"12":{"a":200},"10":{"a":150,"b":250},"11":{"b":90}}}`
	s, err := Unmarshal([]byte(old))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s.Nodes["a"].PeakSeconds, []int64{10, 12}) || !reflect.DeepEqual(s.Nodes["a"].PeakWatts, []float64{150, 200}) ||
		!reflect.DeepEqual(s.Nodes["b"].PeakSeconds, []int64{10, 11}) || !reflect.DeepEqual(s.Nodes["b"].PeakWatts, []float64{250, 90}) {
		t.Fatalf("a %v %v, b %v %v", s.Nodes["a"].PeakSeconds, s.Nodes["a"].PeakWatts, s.Nodes["b"].PeakSeconds, s.Nodes["b"].PeakWatts)
	}
	if got := s.Peak(); got != 400 {
		t.Fatalf("peak %v, want 400 (second 10: 150 + 250)", got)
	}
}
