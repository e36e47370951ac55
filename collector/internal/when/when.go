// Package when reads the times a user gives `--since`/`--until` and the
// console's usage form: a duration back from now (Go's, plus d for days),
// an RFC 3339 time, or a date (midnight UTC, as every time in trainmeter's
// output is UTC).
package when

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// ErrForm is the error of a string in none of the forms.
var ErrForm = errors.New("want a duration back from now (24h, 90m, 7d) or a time (2025-03-01, 2025-03-01T12:00:00Z)")

// Parse reads s relative to now; "" is the zero time.
func Parse(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.ParseFloat(days, 64); err == nil && n >= 0 {
			return now.Add(-time.Duration(n * float64(24*time.Hour))), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, ErrForm
}
