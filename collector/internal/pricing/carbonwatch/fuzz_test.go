package carbonwatch

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// FuzzParseAnswer: whatever a carbon API answers, the collector gets an
// error (a BadAnswerError) or intensities that are finite, >= 0 and on
// whole hours, never a panic.
func FuzzParseAnswer(f *testing.F) {
	for _, seed := range []string{
		`{"zone":"DE","carbonIntensity":302,"datetime":"2026-11-24T17:00:00.000Z","updatedAt":"2026-11-24T17:04:00.000Z","isEstimated":true}`,
		`{"zone":"DE","history":[{"zone":"DE","carbonIntensity":null,"datetime":"2026-11-24T16:00:00.000Z"},{"zone":"DE","carbonIntensity":1e308,"datetime":"2026-11-24T15:30:00+02:00"}]}`,
		`{"zone":"FR","carbonIntensity":50}`,
		`{"history":[1,"x",{"carbonIntensity":-1}]}`,
		`[]`, `null`, `{}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		pts, skipped, err := parseAnswer(bytes.NewReader(b), "DE")
		if err != nil {
			var bad *BadAnswerError
			if !errors.As(err, &bad) || pts != nil {
				t.Fatalf("error %v with %d points", err, len(pts))
			}
			return
		}
		if skipped < 0 {
			t.Fatalf("skipped %d", skipped)
		}
		for _, p := range pts {
			if math.IsNaN(p.g) || math.IsInf(p.g, 0) || p.g < 0 || p.hour%3600 != 0 {
				t.Fatalf("point %+v", p)
			}
		}
	})
}
