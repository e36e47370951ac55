package cli

import (
	"encoding/csv"
	"strings"
	"testing"
)

// A deleted run's usage: a "(deleted)" row of its node in the table (by
// node, and "(deleted)" by model), marked in the CSV; the run is named
// nowhere.
func TestUsageShowsDeletedRuns(t *testing.T) {
	addr := costCollector(t)
	if out, err := run(t, nil, "delete-run", "bert-1", "--collector", addr); err != nil || !strings.Contains(out, "deleted run bert-1") {
		t.Fatalf("delete-run: %v\n%s", err, out)
	}
	table, err := run(t, nil, "usage", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	// bert-1: 4 s at $1 a GPU-second, 300 W.
	var row string
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, "gpu-box-1 (deleted)") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) < 6 || f[2] != "1" || f[3] != "0.0011" || f[4] != "0.000333" || f[5] != "$4.00" {
		t.Errorf("the deleted row: %q\n%s", row, table)
	}
	if !strings.Contains(table, "(deleted): runs deleted since") {
		t.Errorf("the table does not say what (deleted) is:\n%s", table)
	}
	byModel, err := run(t, nil, "usage", "--by", "model", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(byModel, "\n(deleted) ") || strings.Contains(byModel, "bert-1") {
		t.Errorf("usage --by model:\n%s", byModel)
	}
	out, err := run(t, nil, "usage", "--csv", "--collector", addr)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	head, deleted := recs[0], 0
	if head[len(head)-1] != "deleted" {
		t.Fatalf("CSV head %v", head)
	}
	for _, r := range recs[1:] {
		if r[len(r)-1] == "true" {
			deleted++
			if r[0] != "gpu-box-1" || r[2] != "1" {
				t.Errorf("deleted CSV row %v", r)
			}
		}
	}
	if deleted != 1 {
		t.Errorf("%d deleted CSV rows:\n%s", deleted, out)
	}
}
