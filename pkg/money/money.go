// Package money is the one way trainmeter shows dollar amounts to people:
// the run report, runs, summary, model, budget, alerts, forecast,
// recommend and `trainmeter run`'s status line (docs/costs.md, "How money
// is shown"). The CSV and --json keep full precision; this is for text.
//
// Amounts show at least 3 significant digits of the largest amount shown
// with them (at least cents, at most 9 decimals), so a $0.0049 run is not
// "$0.00"; amounts shown together share their decimals; parts are rounded
// so that they add up to the total on screen; nothing is ever written with
// an exponent. Unit prices ($ per GPU-hour, per Mtok, per sample) are rates,
// not amounts: 4 significant digits (Rate).
package money

import (
	"math"
	"sort"
	"strconv"
)

const (
	minDecimals = 2 // cents
	maxDecimals = 9
	sigDigits   = 3
)

// Decimals returns the decimals that show the largest |v| of vs with at
// least 3 significant digits: at least 2, at most 9.
func Decimals(vs ...float64) int {
	largest := 0.0
	for _, v := range vs {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			largest = max(largest, math.Abs(v))
		}
	}
	if largest == 0 {
		return minDecimals
	}
	d := sigDigits - 1 - int(math.Floor(math.Log10(largest)))
	return min(maxDecimals, max(minDecimals, d))
}

// Fixed writes v in dollars with d decimals: "$0.0122", "-$1.50".
func Fixed(v float64, d int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	s := strconv.FormatFloat(math.Abs(v), 'f', d, 64)
	if v < 0 && s != strconv.FormatFloat(0, 'f', d, 64) {
		return "-$" + s
	}
	return "$" + s
}

// USD writes one amount on its own.
func USD(v float64) string { return Fixed(v, Decimals(v)) }

// USDs writes amounts shown side by side (spent and budget, a forecast's
// figures) with the same decimals: those of the largest, or more where a
// smaller amount would otherwise show as zero ($0.003 of $10.000, not
// $0.00 of $10.00).
func USDs(vs ...float64) []string {
	d := Decimals(vs...)
	for _, v := range vs {
		if v != 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
			d = max(d, min(maxDecimals, -int(math.Floor(math.Log10(math.Abs(v))))))
		}
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = Fixed(v, d)
	}
	return out
}

// Split writes a total and the parts that sum to it with the same
// decimals, rounding the parts so that they add up to the total as shown
// (largest remainder): each part is within one unit of its last digit, the
// total is rounded as it is. With a negative part each is rounded alone.
func Split(total float64, parts ...float64) (string, []string) {
	return SplitDecimals(Decimals(append([]float64{total}, parts...)...), total, parts...)
}

// SplitDecimals is Split with the decimals given: for a part that is itself
// split further below (a tariff's bands), in the decimals of its block.
func SplitDecimals(d int, total float64, parts ...float64) (string, []string) {
	out := make([]string, len(parts))
	scale := math.Pow10(d)
	units := make([]float64, len(parts))
	var sum float64
	negative := total < 0
	for i, p := range parts {
		if p < 0 || math.IsNaN(p) || math.IsInf(p, 0) {
			negative = true
		}
		units[i] = math.Floor(p * scale)
		sum += units[i]
	}
	if negative {
		for i, p := range parts {
			out[i] = Fixed(p, d)
		}
		return Fixed(total, d), out
	}
	left := int(math.Round(total*scale) - sum)
	order := make([]int, len(parts))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		ra, rb := parts[order[a]]*scale-units[order[a]], parts[order[b]]*scale-units[order[b]]
		return ra > rb
	})
	for k := 0; k < left && k < len(order); k++ {
		units[order[k]]++
	}
	for i := range parts {
		out[i] = Fixed(units[i]/scale, d)
	}
	return Fixed(total, d), out
}

// Rate writes a unit price with 4 significant digits and no exponent:
// "$2.1", "$0.000007613".
func Rate(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 4, 64), 64)
	if r < 0 {
		return "-$" + strconv.FormatFloat(-r, 'f', -1, 64)
	}
	return "$" + strconv.FormatFloat(r, 'f', -1, 64)
}
