package aggregate

import "testing"

func endFailed(node string, at float64, status, cause string) ev {
	e := endWith(node, at, status)
	e.e.EndError = cause
	return e
}

// TestEndErrorGoesWithItsStatus: across nodes, the cause of the first node
// (by name) that did not end ok goes with its status; a resume that ends
// well clears it; it survives the store's encoding.
func TestEndErrorGoesWithItsStatus(t *testing.T) {
	oom := "torch.cuda.OutOfMemoryError: CUDA out of memory"
	for _, c := range []struct {
		evs        []ev
		wantStatus string
		wantError  string
	}{
		{[]ev{start("a", 0, "m", 0), endFailed("a", 1, "error", oom)}, "error", oom},
		{[]ev{start("a", 0, "m", 0), start("b", 0, "m", 0), endWith("a", 1, "ok"), endFailed("b", 2, "error", oom)}, "error", oom},
		{[]ev{start("a", 0, "m", 0), start("b", 0, "m", 0), endFailed("a", 3, "exit 1", "a's"), endFailed("b", 2, "error", oom)}, "exit 1", "a's"},
		{[]ev{start("a", 0, "m", 0), start("b", 0, "m", 0), endWith("a", 3, "exit 1"), endFailed("b", 2, "error", oom)}, "exit 1", ""},
		{[]ev{start("a", 0, "m", 0), endFailed("a", 1, "error", oom), start("a", 5, "m", 0), endWith("a", 6, "ok")}, "ok", ""},
		{[]ev{start("a", 0, "m", 0), endFailed("a", 1, "error", oom), start("a", 5, "m", 0)}, "", ""},
	} {
		s := fold(c.evs)
		r := s.Report(Pricing{})
		if r.GetEndStatus() != c.wantStatus || r.GetEndError() != c.wantError {
			t.Errorf("%d events: end %q %q, want %q %q", len(c.evs), r.GetEndStatus(), r.GetEndError(), c.wantStatus, c.wantError)
		}
		back, err := Unmarshal(mustEncode(t, s))
		if err != nil {
			t.Fatal(err)
		}
		if got := back.Report(Pricing{}).GetEndError(); got != c.wantError {
			t.Errorf("%d events: decoded end error %q, want %q", len(c.evs), got, c.wantError)
		}
	}
}
