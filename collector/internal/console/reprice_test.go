package console_test

import (
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestRunPageShowsTheReprice: a repriced run's page says when, the cost
// before and the reason, escaped.
func TestRunPageShowsTheReprice(t *testing.T) {
	c := startCollector(t, nil)
	c.seed(t)
	q := trainmeterv1.NewQueryServiceClient(tu.Dial(t, c.srv.Addr().String()))
	if _, err := q.Reprice(t.Context(), &trainmeterv1.RepriceRequest{RunId: evilRun, UsdPerGpuHour: 1, Reason: evilNote}); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, nil, c.base+runPath(evilRun))
	// 5 GPU-seconds at the flag's $2/GPU-hour before ($0.002778, shown to two significant digits).
	for _, want := range []string{`id="repriced"`, "Repriced 2", "cost was $0.0028 total, GPU $0.0028", `&lt;script&gt;alert(&#34;note&#34;)&lt;/script&gt;`} {
		if !strings.Contains(body, want) {
			t.Errorf("run page lacks %q", want)
		}
	}
	if strings.Contains(body, evilNote) {
		t.Error("the reason is raw in the page")
	}
	if _, other := get(t, nil, c.base+runPath(evilRun2)); strings.Contains(other, `id="repriced"`) {
		t.Error("a run never repriced shows a reprice")
	}
}
