package aggregate

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
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
			fill(v.Field(i), n)
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
	if !reflect.DeepEqual(got, &s) {
		gj, _ := json.Marshal(got)
		wj, _ := json.Marshal(&s)
		t.Fatalf("round trip lost something (a State field missing from codec.go or aggregate.proto?)\n got %s\nwant %s", gj, wj)
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
	if !reflect.DeepEqual(got, &s) {
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
