package budget

import (
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// The CLI gives both collectors of a pair the same budget id; a malformed
// one is refused and changes nothing.
func TestSetKeepsAGivenBudgetIDAndRefusesABadOne(t *testing.T) {
	st := openStore(t, t.TempDir())
	defer st.Close()
	m := New(Config{Clock: clock.NewFake(tu.Now())}, st, report, nil, &collected{}, quiet())
	b, err := m.Set(Budget{ID: "0123456789abcdef", Scope: "proj", LimitUSD: 10})
	if err != nil || b.ID != "0123456789abcdef" {
		t.Fatalf("Set with an id: %v %v", b.ID, err)
	}
	for _, bad := range []string{"xyz", "0123456789ABCDEF", "0123456789abcdef0"} {
		if _, err := m.Set(Budget{ID: bad, Scope: "other", LimitUSD: 10}); err == nil || !strings.Contains(err.Error(), "16 lowercase hex") {
			t.Errorf("id %q: %v", bad, err)
		}
	}
	if got, err := m.Budgets(); err != nil || len(got) != 1 {
		t.Errorf("%d budgets after the refused ones (%v), want 1", len(got), err)
	}
}
