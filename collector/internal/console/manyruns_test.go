package console_test

import (
	"fmt"
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestRunsPageListsEveryPage: the Runs page counts and pages runs past one
// ListRuns page (1,000 runs): it reads every page in process.
func TestRunsPageListsEveryPage(t *testing.T) {
	c := startCollector(t, nil)
	conn := tu.Dial(t, c.srv.Addr().String())
	const n, perBatch, perNode = 1200, 50, 100
	for node := 0; node < n/perNode; node++ {
		a := tu.Connect(t, conn, fmt.Sprintf("node-%02d", node), "boot")
		for b := 0; b < perNode/perBatch; b++ {
			var windows []*trainmeterv1.RunWindow
			var events []*trainmeterv1.RunEvent
			for i := 0; i < perBatch; i++ {
				id := fmt.Sprintf("run-%04d", node*perNode+b*perBatch+i)
				windows = append(windows, tu.Window(id, 0, 10, 5))
				events = append(events, tu.Start(id, 0, "m"), tu.End(id, 1))
			}
			a.MustAck(tu.Batch(uint64(b+1), 0, windows, events...))
		}
		a.Close()
	}
	_, body := get(t, nil, c.base+"/runs/rows")
	if !strings.Contains(body, fmt.Sprintf(`data-total="%d"`, n)) {
		i := strings.Index(body, "data-total")
		t.Fatalf("runs rows do not count %d runs: %.80s", n, body[max(0, i):])
	}
	if !strings.Contains(body, fmt.Sprintf("%d runs · page 1 of %d", n, n/200)) {
		t.Errorf("runs rows do not page %d runs", n)
	}
}
