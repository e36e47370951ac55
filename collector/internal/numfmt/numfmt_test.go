package numfmt

import (
	"math"
	"testing"
)

func TestSig(t *testing.T) {
	for _, c := range []struct {
		v    float64
		n    int
		want string
	}{
		{7.505e-05, 4, "0.00007505"}, {20341, 4, "20341"}, {20341.6, 4, "20342"}, {-20341, 4, "-20341"},
		{1.23456, 4, "1.235"}, {123.456, 4, "123.5"}, {1234.56, 4, "1235"}, {9.99996, 4, "10"},
		{0.5, 4, "0.5"}, {0.99, 4, "0.99"}, {0, 4, "0"}, {1.5e-7, 4, "1.5e-07"}, {2e15, 4, "2e+15"},
		{0.0123, 2, "0.012"}, {math.NaN(), 4, "-"}, {math.Inf(1), 4, "-"},
	} {
		if got := Sig(c.v, c.n); got != c.want {
			t.Errorf("Sig(%v, %d) = %q, want %q", c.v, c.n, got, c.want)
		}
	}
}
