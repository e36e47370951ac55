// Package httpretry is the retry loop the collector's HTTP clients share
// (the GPU price providers, the carbon intensity API): capped exponential
// backoff with jitter that waits at least what the server's Retry-After
// asked. Each client keeps its own idea of what is worth retrying.
package httpretry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// HTTPError is a non-2xx answer: its status and the start of its body.
type HTTPError struct {
	Status int
	Body   string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// Policy bounds the retries.
type Policy struct {
	// Attempts in all, the first included (at least 1).
	Attempts int
	// MaxBackoff caps the exponential backoff, which starts at 1 s.
	MaxBackoff time.Duration
	// MaxRetryAfter caps the wait a Retry-After asks for.
	MaxRetryAfter time.Duration
	// Sleep waits d or until ctx ends (tests replace it to record waits).
	Sleep func(ctx context.Context, d time.Duration) error
}

// Do calls try until it succeeds, says its error is not worth retrying,
// the attempts run out or ctx ends. Between tries it waits a jittered
// backoff in [b/2, b], b doubling from 1 s up to MaxBackoff, or the
// Retry-After try returned (up to MaxRetryAfter) if longer. The error
// names what, and holds try's last error.
func Do(ctx context.Context, what string, p Policy, try func(ctx context.Context) (retryAfter time.Duration, retryable bool, err error)) error {
	backoff := time.Second
	for attempt := 1; ; attempt++ {
		retryAfter, retryable, err := try(ctx)
		if err == nil {
			return nil
		}
		if !retryable || attempt >= p.Attempts || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		wait = max(wait, min(retryAfter, p.MaxRetryAfter))
		if serr := p.Sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%s: %w (after %v)", what, serr, err)
		}
		backoff = min(2*backoff, p.MaxBackoff)
	}
}
