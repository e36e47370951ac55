package money

import "testing"

func TestUSDShowsSmallAmounts(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "$0.00"},
		{0.0049, "$0.00490"},
		{0.0122, "$0.0122"},
		{0.5, "$0.500"},
		{1.234, "$1.23"},
		{5000, "$5000.00"},
		{-0.02, "-$0.0200"},
		{7.613e-06, "$0.00000761"},
		{1e-12, "$0.000000000"},
	} {
		if got := USD(tc.v); got != tc.want {
			t.Errorf("USD(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestRateHasNoExponent(t *testing.T) {
	for v, want := range map[float64]string{7.613e-06: "$0.000007613", 2.1: "$2.1", 12345.6: "$12350", 0: "$0"} {
		if got := Rate(v); got != want {
			t.Errorf("Rate(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestUSDsShareDecimals(t *testing.T) {
	got := USDs(0.0246, 0.02)
	if got[0] != "$0.0246" || got[1] != "$0.0200" {
		t.Errorf("USDs = %v, want [$0.0246 $0.0200]", got)
	}
	if got := USDs(0.003, 10); got[0] != "$0.003" || got[1] != "$10.000" {
		t.Errorf("USDs = %v, want [$0.003 $10.000]: a small amount beside a large one is not $0.00", got)
	}
}

// TestAmountShowsTwoSignificantDigits: each amount is rounded on its own,
// to its first two significant digits and at least cents.
func TestAmountShowsTwoSignificantDigits(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{0, "$0.00"},
		{0.09563, "$0.096"},
		{0.00047, "$0.00047"},
		{0.0004999, "$0.00050"},
		{12.345678, "$12.35"},
		{0.5, "$0.50"},
		{1234.5, "$1234.50"},
		{-0.0123, "-$0.012"},
		{1e-12, "$0.000000000"},
	} {
		if got := Amount(tc.v); got != tc.want {
			t.Errorf("Amount(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestAddsUpComparesTheShownAmounts(t *testing.T) {
	for _, tc := range []struct {
		total string
		parts []string
		want  bool
	}{
		{"$1.07", []string{"$1.05", "$0.020"}, true},
		{"$0.096", []string{"$0.096", "$0.00047"}, false},
		{"$0.10", []string{"$0.096", "$0.0040"}, true},
		{"-$0.010", []string{"$0.010", "-$0.020"}, true},
		{"-", []string{"$0.010"}, false},
	} {
		if got := AddsUp(tc.total, tc.parts...); got != tc.want {
			t.Errorf("AddsUp(%s, %v) = %v, want %v", tc.total, tc.parts, got, tc.want)
		}
	}
}
