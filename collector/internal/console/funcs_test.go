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

// TestNumbersReadAlike: the console writes figures in the one format the
// CLI's tables use (numfmt): decimal notation, four significant digits,
// whole numbers kept whole; never an exponent next to a plain number.
func TestNumbersReadAlike(t *testing.T) {
	n := funcs["num"].(func(float64) string)
	for v, want := range map[float64]string{7.505e-05: "0.00007505", 20341: "20341", 20341.4: "20341", 1.23456: "1.235", 0: "0", 123.456: "123.5"} {
		if got := n(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
}
