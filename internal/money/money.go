// Package money is the one way trainmeter shows dollar amounts to people
// (docs/costs.md, "How money is shown"); the CSV and --json keep full
// precision. Nothing is ever written with an exponent, and an amount
// shows enough digits not to read as zero ($0.0049 is not "$0.00").
package money

import (
	"math"
	"math/big"
	"strconv"
	"strings"
)

const (
	minDecimals  = 2 // cents
	maxDecimals  = 9
	sigDigits    = 3 // of the largest amount shown together (Decimals)
	amountDigits = 2 // of an amount rounded on its own (Amount)
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
	return decimals(largest, sigDigits)
}

// decimals shows |v| with digits significant digits: at least cents, at
// most 9 decimals.
func decimals(v float64, digits int) int {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return minDecimals
	}
	d := digits - 1 - int(math.Floor(math.Log10(math.Abs(v))))
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
		d = max(d, decimals(v, 1)) // its first digit
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = Fixed(v, d)
	}
	return out
}

// Amount writes one amount of a list whose lines are each rounded on their
// own, never to fit a sum: "$0.096", "$0.00047", "$12.35". Where the
// amounts shown do not add up to the total shown, the total says so
// (AddsUp).
func Amount(v float64) string { return Fixed(v, decimals(v, amountDigits)) }

// AddsUp reports whether the amounts parts, as Fixed writes them, add up
// exactly to total as written; false when any is not a plain amount ("-").
func AddsUp(total string, parts ...string) bool {
	want, ok := parse(total)
	if !ok {
		return false
	}
	sum := new(big.Rat)
	for _, p := range parts {
		v, ok := parse(p)
		if !ok {
			return false
		}
		sum.Add(sum, v)
	}
	return sum.Cmp(want) == 0
}

// parse reads an amount Fixed wrote ("$0.096", "-$1.50") exactly.
func parse(s string) (*big.Rat, bool) {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	if !strings.HasPrefix(s, "$") {
		return nil, false
	}
	v, ok := new(big.Rat).SetString(s[1:])
	if !ok {
		return nil, false
	}
	if neg {
		v.Neg(v)
	}
	return v, true
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
