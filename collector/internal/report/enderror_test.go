package report

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
)

// TestEndErrorIsShown: a failed run's cause is in the CSV as given (the
// end_error column) and in the report text quoted, so a newline or a
// terminal escape in it cannot forge lines.
func TestEndErrorIsShown(t *testing.T) {
	r := fullRun()
	r.EndStatus = "error"
	r.EndError = "torch.cuda.OutOfMemoryError: CUDA out of memory, \"2 GiB\"\n\x1b[2Jé"
	col := slices.Index(Header(), "end_error")
	if col < 0 {
		t.Fatal("no end_error column")
	}
	var buf bytes.Buffer
	if err := WriteCSV(&buf, []*RunReport{r}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := rows[1][col]; got != r.EndError {
		t.Errorf("end_error cell %q, want %q", got, r.EndError)
	}
	if got := cell(t, fullRun(), "end_error"); got != "" {
		t.Errorf("end_error of a run that ended ok: %q, want empty", got)
	}

	buf.Reset()
	if err := WriteReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(buf.String(), "\n")
	want := `  cause:             "torch.cuda.OutOfMemoryError: CUDA out of memory, \"2 GiB\"\n\x1b[2Jé"`
	if lines[0] != "run llama-sft-1 (ended: error)" || lines[1] != want {
		t.Errorf("report starts\n%s\n%s\nwant line 2\n%s", lines[0], lines[1], want)
	}
	buf.Reset()
	if err := WriteReport(&buf, fullRun()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "cause:") {
		t.Errorf("a run with no end error shows a cause:\n%s", buf.String())
	}
}
