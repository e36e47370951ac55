package httpretry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDoBacksOffHonoursRetryAfterAndStops(t *testing.T) {
	busy := errors.New("HTTP 429")
	var waits []time.Duration
	p := Policy{Attempts: 4, MaxBackoff: 4 * time.Second, MaxRetryAfter: 30 * time.Second,
		Sleep: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }}

	// Busy twice (the second asks for 10 s), then an answer.
	tries := 0
	err := Do(context.Background(), "api", p, func(context.Context) (time.Duration, bool, error) {
		tries++
		switch tries {
		case 1:
			return 0, true, busy
		case 2:
			return 10 * time.Second, true, busy
		}
		return 0, false, nil
	})
	if err != nil || tries != 3 || len(waits) != 2 {
		t.Fatalf("err %v after %d tries, waits %v", err, tries, waits)
	}
	if waits[0] < 500*time.Millisecond || waits[0] > time.Second || waits[1] != 10*time.Second {
		t.Errorf("waits %v, want one in [0.5 s, 1 s] then the Retry-After's 10 s", waits)
	}

	// Always busy, asking for an hour: Attempts tries, each wait capped.
	waits, tries = nil, 0
	err = Do(context.Background(), "api", p, func(context.Context) (time.Duration, bool, error) { tries++; return time.Hour, true, busy })
	if !errors.Is(err, busy) || !strings.HasPrefix(err.Error(), "api: ") || tries != 4 || len(waits) != 3 || waits[2] != 30*time.Second {
		t.Fatalf("always busy: %v after %d tries, waits %v", err, tries, waits)
	}

	// Not worth retrying: one try.
	tries = 0
	bad := errors.New("HTTP 404")
	if err := Do(context.Background(), "api", p, func(context.Context) (time.Duration, bool, error) { tries++; return 0, false, bad }); !errors.Is(err, bad) || tries != 1 {
		t.Fatalf("not retryable: %v after %d tries", err, tries)
	}

	// A wait cut short by ctx ends the loop with both errors.
	p.Sleep = func(ctx context.Context, _ time.Duration) error { return context.Canceled }
	err = Do(context.Background(), "api", p, func(context.Context) (time.Duration, bool, error) { return 0, true, busy })
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "after HTTP 429") {
		t.Fatalf("cancelled wait: %v", err)
	}
}
