package money

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

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

func dollars(t *testing.T, s string) (int64, int) {
	t.Helper()
	s = strings.TrimPrefix(s, "$")
	dec := len(s) - strings.IndexByte(s, '.') - 1
	n, err := strconv.ParseInt(strings.Replace(s, ".", "", 1), 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n, dec
}

// TestSplitPartsAddUpToTheTotalAsShown: the issue's $0.01 + $0.0005 =
// $0.0122, and random splits.
func TestSplitPartsAddUpToTheTotalAsShown(t *testing.T) {
	total, parts := Split(0.01174+0.00054, 0.01174, 0.00054)
	if total != "$0.0123" || parts[0] != "$0.0118" || parts[1] != "$0.0005" {
		t.Errorf("Split = %s %v, want $0.0123 [$0.0118 $0.0005]", total, parts)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		ps := make([]float64, 1+rng.IntN(4))
		sum := 0.0
		for i := range ps {
			ps[i] = math.Pow(10, rng.Float64()*8-5)
			sum += ps[i]
		}
		ts, shown := Split(sum, ps...)
		want, d := dollars(t, ts)
		var got int64
		for _, s := range shown {
			n, pd := dollars(t, s)
			if pd != d {
				t.Fatalf("%s and %s: different decimals", ts, s)
			}
			got += n
		}
		if got != want {
			t.Fatalf("parts %v of %v shown as %v sum to %d, total shown %s", ps, sum, shown, got, ts)
		}
	}
}
