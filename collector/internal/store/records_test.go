package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

func TestRecordsRoundTripScanAndSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(dir, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutRecords("alerts", map[string][]byte{"b/2": []byte("two"), "b/1": []byte("one"), "c": []byte("other")}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutRecord("budgets", "b/1", []byte("not an alert")); err != nil {
		t.Fatal(err)
	}
	if err := st.PutRecord("", "k", nil); err == nil {
		t.Fatal("empty namespace accepted")
	}
	st.Close()
	if st, err = Open(dir, Options{Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got []string
	if err := st.ScanRecords("alerts", "b/", func(k string, v []byte) (bool, error) {
		got = append(got, k+"="+string(v))
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[b/1=one b/2=two]" {
		t.Fatalf("scan: %v", got)
	}
	if v, err := st.GetRecord("budgets", "b/1"); err != nil || string(v) != "not an alert" {
		t.Fatalf("get: %q %v", v, err)
	}
	if err := st.DeleteRecord("budgets", "b/1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetRecord("budgets", "b/1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	// Records never show up as runs.
	if runs, err := st.ListRuns(nil); err != nil || len(runs) != 0 {
		t.Fatalf("records leaked into runs: %v %v", runs, err)
	}
}

func TestPutRecordIfAbsentHasExactlyOneWinner(t *testing.T) {
	st := open(t, t.TempDir())
	defer st.Close()
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := st.PutRecordIfAbsent("fired", "budget-a/2026-11/50", []byte{byte(i)})
			if err != nil {
				t.Error(err)
			}
			if ok {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d winners, want 1", wins.Load())
	}
}
