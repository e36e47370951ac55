package when

import (
	"errors"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"24h":                  now.Add(-24 * time.Hour),
		"90m":                  now.Add(-90 * time.Minute),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"0.5d":                 now.Add(-12 * time.Hour),
		"2025-03-01":           time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC),
		"2025-03-01T12:30:00":  time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC),
		"2025-03-01T12:30:00Z": time.Date(2025, 3, 1, 12, 30, 0, 0, time.UTC),
	} {
		got, err := Parse(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"yesterday", "-1h", "-2d", "2025-13-01"} {
		if _, err := Parse(bad, now); !errors.Is(err, ErrForm) {
			t.Errorf("Parse(%q): err %v, want ErrForm", bad, err)
		}
	}
}
