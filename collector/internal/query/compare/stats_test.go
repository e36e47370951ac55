package compare

import (
	"math"
	"testing"
)

func TestTDistributionAgainstTables(t *testing.T) {
	// Two-sided 95 % critical values from published t tables (and
	// scipy.stats.t.ppf(0.975, df)).
	for _, tc := range []struct{ df, want float64 }{
		{1, 12.706204736}, {2, 4.302652730}, {3, 3.182446305}, {4, 2.776445105},
		{5, 2.570581836}, {9, 2.262157163}, {10, 2.228138852}, {30, 2.042272456},
		{100, 1.983971519}, {1e6, 1.959966},
	} {
		if got := TQuantile(0.975, tc.df); math.Abs(got-tc.want) > 1e-6*tc.want {
			t.Errorf("t.ppf(0.975, %g) = %.9f, want %.9f", tc.df, got, tc.want)
		}
	}
	// scipy.stats.t.cdf values.
	for _, tc := range []struct{ x, df, want float64 }{
		{0, 7, 0.5}, {1, 1, 0.75}, {-1, 1, 0.25}, {2, 5, 0.9490302605850709},
		{-3, 10, 0.006671828},
	} {
		if got := TCDF(tc.x, tc.df); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("t.cdf(%g, %g) = %.9f, want %.9f", tc.x, tc.df, got, tc.want)
		}
	}
	// df = 2 has a closed form: 1/2 + t / (2 √(2 + t²)).
	for _, x := range []float64{-4, -0.3, 1.5, 9} {
		if got, want := TCDF(x, 2), 0.5+x/(2*math.Sqrt(2+x*x)); math.Abs(got-want) > 1e-12 {
			t.Errorf("t.cdf(%g, 2) = %v, want %v", x, got, want)
		}
	}
	// I_x(a, b) with closed forms: I_x(1, b) = 1-(1-x)^b, I_x(a, 1) = x^a.
	if got := RegIncBeta(1, 3, 0.2); math.Abs(got-(1-math.Pow(0.8, 3))) > 1e-12 {
		t.Errorf("I_0.2(1,3) = %v", got)
	}
	if got := RegIncBeta(2.5, 1, 0.7); math.Abs(got-math.Pow(0.7, 2.5)) > 1e-12 {
		t.Errorf("I_0.7(2.5,1) = %v", got)
	}
}

func TestWelchAgainstScipy(t *testing.T) {
	// The first example of the Wikipedia article on Welch's t-test:
	// t = -2.46, df = 24.98, p = 0.021 (as scipy.stats.ttest_ind(a, b,
	// equal_var=False) gives).
	a := Summarize([]float64{27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4})
	b := Summarize([]float64{27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4})
	p, ok := Welch(a, b)
	if !ok || math.Abs(p-0.021) > 0.0005 {
		t.Errorf("Welch p = %v (%v), want 0.021", p, ok)
	}
	if df := welchDF(a.varMean(), b.varMean(), a.N, b.N); math.Abs(df-24.98) > 0.01 {
		t.Errorf("Welch df = %v, want 24.98", df)
	}
	if _, ok := Welch(Summarize([]float64{1}), b); ok {
		t.Error("Welch with one value gave a p-value")
	}
}

func TestSummarize(t *testing.T) {
	// Mean 2, sd 1, n 3: half width t(0.975, 2) × 1/√3 = 2.484138.
	s := Summarize([]float64{1, 2, 3})
	if !s.HasInterval || math.Abs(s.Mean-2) > 1e-12 || math.Abs(s.SD-1) > 1e-12 || math.Abs(s.High-2-2.4841377) > 1e-6 {
		t.Errorf("%+v", s)
	}
	if one := Summarize([]float64{5}); one.HasInterval || one.Mean != 5 {
		t.Errorf("one value: %+v", one)
	}
	lo, hi, ok := RatioInterval(Summarize([]float64{2, 2.2, 1.8}), Summarize([]float64{1, 1.1, 0.9}))
	if !ok || lo >= 2 || hi <= 2 {
		t.Errorf("ratio interval [%v, %v] %v does not hold 2", lo, hi, ok)
	}
}

// TestWelchDFByHand: Welch–Satterthwaite degrees of freedom on a small
// example worked by hand, independent of TestWelchAgainstScipy's data.
// a = 1..5: mean 3, s² = 10/4 = 2.5, s²/n = 1/2. b = 10, 20, 30: mean 20,
// s² = 200/2 = 100, s²/n = 100/3.
// df = (1/2 + 100/3)² / ((1/2)²/4 + (100/3)²/2) = (41209/36) / (80009/144)
// = 164836/80009 ≈ 2.0602. And with equal variances of the mean and equal
// n, df = 2(n−1) (the pooled test's df).
func TestWelchDFByHand(t *testing.T) {
	a, b := Summarize([]float64{1, 2, 3, 4, 5}), Summarize([]float64{10, 20, 30})
	if math.Abs(a.varMean()-0.5) > 1e-12 || math.Abs(b.varMean()-100.0/3) > 1e-12 {
		t.Fatalf("variances of the means %v, %v; want 1/2, 100/3", a.varMean(), b.varMean())
	}
	if df, want := welchDF(a.varMean(), b.varMean(), a.N, b.N), 164836.0/80009; math.Abs(df-want) > 1e-12 {
		t.Errorf("df = %v, want 164836/80009 = %v", df, want)
	}
	for _, n := range []int{2, 5, 30} {
		if df := welchDF(0.7, 0.7, n, n); math.Abs(df-float64(2*(n-1))) > 1e-12 {
			t.Errorf("equal variances, n = %d each: df = %v, want %d", n, df, 2*(n-1))
		}
	}
}
