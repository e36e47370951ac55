package console

import "testing"

// TestUSDRoundsAsTheReport: an amount in the console reads as in
// `trainmeter report` (two significant digits, at least cents), and a
// price per GPU-hour as a rate.
func TestUSDRoundsAsTheReport(t *testing.T) {
	usd := funcs["usd"].(func(float64) string)
	rate := funcs["rate"].(func(float64) string)
	for v, want := range map[float64]string{0.09563: "$0.096", 0.00047: "$0.00047", 12.3456: "$12.35"} {
		if got := usd(v); got != want {
			t.Errorf("usd(%v) = %q, want %q", v, got, want)
		}
	}
	if got := rate(2.125); got != "$2.125" {
		t.Errorf("rate(2.125) = %q, want $2.125", got)
	}
}
