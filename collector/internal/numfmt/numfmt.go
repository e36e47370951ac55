// Package numfmt is how trainmeter writes a figure for people to read: the
// CLI's tables and the console use it, so a figure reads the same in both.
// JSON and CSV carry full precision instead.
package numfmt

import (
	"math"
	"strconv"
	"strings"
)

// Sig writes v with at most n significant digits in decimal notation (no
// exponent, no trailing zeros), keeping a whole number's every digit:
// 20341 stays "20341" rather than "2.034e+04" or "20340", and 7.505e-05
// reads "0.00007505".
// Outside 1e-6 ≤ |v| < 1e15, where decimals would be unreadably long, it
// falls back to an exponent. NaN and ±Inf are "-" (no figure).
func Sig(v float64, n int) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "-"
	case v == 0:
		return "0"
	}
	a := math.Abs(v)
	if a < 1e-6 || a >= 1e15 {
		return strconv.FormatFloat(v, 'g', n, 64)
	}
	// Round to n significant digits first: 9.9996 at 4 digits is 10.00,
	// whose digit count differs from the unrounded value's.
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', n, 64), 64)
	decimals := n - 1 - int(math.Floor(math.Log10(math.Abs(r))))
	if decimals <= 0 {
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	}
	out := strconv.FormatFloat(r, 'f', decimals, 64)
	// Trailing zeros say nothing: 0.99 rather than 0.9900.
	out = strings.TrimRight(out, "0")
	return strings.TrimSuffix(out, ".")
}

// Num is a figure in a table or on a card: four significant digits.
func Num(v float64) string { return Sig(v, 4) }
