package compare

import (
	"math"
)

// Summary is the mean of a sample and its 95 % confidence interval from
// Student's t distribution with n-1 degrees of freedom.
type Summary struct {
	N           int
	Mean        float64
	SD          float64 // sample standard deviation (n-1); 0 when N < 2
	HasInterval bool
	Low, High   float64
}

// Summarize returns xs' mean and, for two values or more, its 95 % interval.
func Summarize(xs []float64) Summary {
	s := Summary{N: len(xs)}
	if s.N == 0 {
		return s
	}
	for _, x := range xs {
		s.Mean += x
	}
	s.Mean /= float64(s.N)
	if s.N < 2 {
		return s
	}
	var ss float64
	for _, x := range xs {
		ss += (x - s.Mean) * (x - s.Mean)
	}
	s.SD = math.Sqrt(ss / float64(s.N-1))
	h := TQuantile(0.975, float64(s.N-1)) * s.SD / math.Sqrt(float64(s.N))
	s.HasInterval, s.Low, s.High = true, s.Mean-h, s.Mean+h
	return s
}

// variance of the mean, s²/n.
func (s Summary) varMean() float64 { return s.SD * s.SD / float64(s.N) }

// Welch returns the two-sided p-value of Welch's unequal-variances t-test
// for the means of a and b. ok is false when either has fewer than two
// values or both have no spread (the test is undefined).
func Welch(a, b Summary) (p float64, ok bool) {
	if a.N < 2 || b.N < 2 {
		return 0, false
	}
	va, vb := a.varMean(), b.varMean()
	se2 := va + vb
	if se2 == 0 {
		return 0, false
	}
	t := (a.Mean - b.Mean) / math.Sqrt(se2)
	return TwoSidedP(t, welchDF(va, vb, a.N, b.N)), true
}

// welchDF is the Welch–Satterthwaite degrees of freedom of va + vb, each a
// variance of a mean over na and nb values.
func welchDF(va, vb float64, na, nb int) float64 {
	den := va*va/float64(na-1) + vb*vb/float64(nb-1)
	if den == 0 {
		return float64(na + nb - 2)
	}
	return (va + vb) * (va + vb) / den
}

// RatioInterval is the 95 % interval of mean(a)/mean(b) by the delta method
// on the log of the ratio, with Welch–Satterthwaite degrees of freedom.
// ok is false when either has fewer than two values or a mean is not
// positive.
func RatioInterval(a, b Summary) (low, high float64, ok bool) {
	if a.N < 2 || b.N < 2 || a.Mean <= 0 || b.Mean <= 0 {
		return 0, 0, false
	}
	// Relative variances of the means.
	ra, rb := a.varMean()/(a.Mean*a.Mean), b.varMean()/(b.Mean*b.Mean)
	r := a.Mean / b.Mean
	if ra+rb == 0 {
		return r, r, true
	}
	h := TQuantile(0.975, welchDF(ra, rb, a.N, b.N)) * math.Sqrt(ra+rb)
	return r * math.Exp(-h), r * math.Exp(h), true
}

// TCDF is the cumulative distribution function of Student's t distribution
// with df degrees of freedom (df > 0, not necessarily whole).
func TCDF(t, df float64) float64 {
	tail := 0.5 * RegIncBeta(df/2, 0.5, df/(df+t*t)) // P(T > |t|); 0 at t = ±∞
	if t > 0 {
		return 1 - tail
	}
	return tail
}

// TwoSidedP is P(|T| ≥ |t|) for Student's t with df degrees of freedom.
func TwoSidedP(t, df float64) float64 {
	return RegIncBeta(df/2, 0.5, df/(df+t*t))
}

// TQuantile is the p-quantile of Student's t with df degrees of freedom,
// found by bisection on TCDF (monotone; 200 halvings reach float precision).
func TQuantile(p, df float64) float64 {
	if p == 0.5 {
		return 0
	}
	if p < 0.5 {
		return -TQuantile(1-p, df)
	}
	lo, hi := 0.0, 1.0
	for TCDF(hi, df) < p {
		hi *= 2
		if hi > 1e12 {
			return math.Inf(1)
		}
	}
	for range 200 {
		mid := (lo + hi) / 2
		if mid == lo || mid == hi {
			break
		}
		if TCDF(mid, df) < p {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// RegIncBeta is the regularized incomplete beta function I_x(a, b), by the
// continued fraction of Numerical Recipes (betacf, modified Lentz), using
// the symmetry I_x(a,b) = 1 − I_{1−x}(b,a) where the fraction converges
// slowly.
func RegIncBeta(a, b, x float64) float64 {
	switch {
	case x <= 0:
		return 0
	case x >= 1:
		return 1
	}
	la, _ := math.Lgamma(a)
	lb, _ := math.Lgamma(b)
	lab, _ := math.Lgamma(a + b)
	front := math.Exp(lab - la - lb + a*math.Log(x) + b*math.Log1p(-x))
	if x < (a+1)/(a+b+2) {
		return front * betaCF(a, b, x) / a
	}
	return 1 - front*betaCF(b, a, 1-x)/b
}

// betaCF is the incomplete beta's continued fraction (modified Lentz); each
// iteration applies an even and an odd term through step.
func betaCF(a, b, x float64) float64 {
	const (
		maxIter = 500
		eps     = 1e-15
		tiny    = 1e-300
	)
	nonZero := func(v float64) float64 {
		if math.Abs(v) < tiny {
			return tiny
		}
		return v
	}
	qab, qap, qam := a+b, a+1, a-1
	c, d := 1.0, 1/nonZero(1-qab*x/qap)
	h := d
	// step applies one term aa and returns its factor on h.
	step := func(aa float64) float64 {
		d = 1 / nonZero(1+aa*d)
		c = nonZero(1 + aa/c)
		return d * c
	}
	for m := 1; m <= maxIter; m++ {
		fm := float64(m)
		m2 := 2 * fm
		h *= step(fm * (b - fm) * x / ((qam + m2) * (a + m2)))
		del := step(-(a + fm) * (qab + fm) * x / ((a + m2) * (qap + m2)))
		h *= del
		if math.Abs(del-1) < eps {
			break
		}
	}
	return h
}
