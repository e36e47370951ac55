package store

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
)

// A data directory a store holds open is refused by a second Open with
// ErrLocked (what `trainmeter migrate` turns into "stop the collector").
func TestOpenLockedDir(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	_, err := Open(dir, Options{Logger: quiet()})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("second open: %v, want ErrLocked naming %s", err, dir)
	}
}

// Export yields every kind of row with its key decoded; a store holding a
// key of a kind it does not know is refused rather than moved in part.
func TestExport(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := s.ApplyBatch("node-1", "boot-1", batch(7, "run-a", 5, 100, 50, runStart("run-a", 5))); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRecord("budgets", "k\x00ey", []byte("v")); err != nil {
		t.Fatal(err)
	}
	var got []string
	err := s.Export(func(d storage.Dump) error {
		for st, err := range d.Runs() {
			if err != nil {
				return err
			}
			got = append(got, "run "+st.RunId)
		}
		for a, err := range d.AppliedBatches() {
			if err != nil {
				return err
			}
			got = append(got, fmt.Sprintf("applied %s %s %d %d %v", a.Node, a.Boot, a.Seq, a.Start, a.StartKnown))
		}
		for r, err := range d.Raw(storage.RawRunWindows) {
			if err != nil {
				return err
			}
			got = append(got, fmt.Sprintf("window %s %s %d %d %d", r.Run, r.Node, r.Start, r.Seq, r.I))
		}
		for r, err := range d.Records() {
			if err != nil {
				return err
			}
			got = append(got, fmt.Sprintf("record %s %q %s", r.NS, r.Key, r.Value))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t5 := ts(5).AsTime().UnixNano()
	want := []string{"run run-a", fmt.Sprintf("applied node-1 boot-1 7 %d true", t5), fmt.Sprintf("window run-a node-1 %d 7 0", t5), `record budgets "k\x00ey" v`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("export:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	s.Close()

	rawSet(t, dir, "zz/unknown", "x")
	s = open(t, dir)
	defer s.Close()
	if err := s.Export(func(storage.Dump) error { return nil }); err == nil || !strings.Contains(err.Error(), "zz/unknown") {
		t.Errorf("export of a store with an unknown key: %v, want refused naming it", err)
	}
}
