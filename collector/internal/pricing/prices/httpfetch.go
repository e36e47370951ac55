package prices

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/internal/httpretry"
)

// HTTPOptions are how the HTTP providers (vast.ai, Lambda, RunPod, Azure)
// call their API: every request, a page of a paged answer included, is
// retried on HTTP 429 and 5xx with capped exponential backoff and jitter,
// waiting at least what Retry-After says (up to MaxRetryAfter).
type HTTPOptions struct {
	Client      *http.Client  // a 30 s timeout one if nil
	MaxAttempts int           // on HTTP 429 and 5xx; 0: 5
	MaxBackoff  time.Duration // caps the backoff between attempts; 0: 60 s
	// MaxRetryAfter caps the wait a Retry-After header asks for (a rate
	// limit often asks for minutes); 0: DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// Sleep waits between attempts (tests replace it); nil: a timer that
	// ends early when ctx does.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultMaxRetryAfter is the longest Retry-After the client honours.
const DefaultMaxRetryAfter = 10 * time.Minute

// maxAnswerBytes bounds one answer (or page) read from a provider.
const maxAnswerBytes = 256 << 20

// HTTPError is a non-2xx answer.
type HTTPError = httpretry.HTTPError

// get sends method u asking for JSON (body, when not nil, is a JSON
// request body; apiKey, when set, goes in "Authorization: Bearer KEY",
// never in the URL, where errors and proxies would show it), again on 429
// and 5xx, and returns the body of the first 2xx answer. what names the
// provider in errors.
func (o HTTPOptions) get(ctx context.Context, what, method, u, apiKey string, body []byte) ([]byte, error) {
	client := cmp.Or(o.Client, &http.Client{Timeout: 30 * time.Second})
	p := httpretry.Policy{Attempts: cmp.Or(o.MaxAttempts, 5), MaxBackoff: cmp.Or(o.MaxBackoff, time.Minute),
		MaxRetryAfter: cmp.Or(o.MaxRetryAfter, DefaultMaxRetryAfter), Sleep: o.Sleep}
	if p.Sleep == nil {
		p.Sleep = sleepCtx
	}
	var answer []byte
	err := httpretry.Do(ctx, what, p, func(ctx context.Context) (time.Duration, bool, error) {
		req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
		if err != nil {
			return 0, false, err
		}
		req.Header.Set("Accept", "application/json")
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		b, retryAfter, err := once(client, req)
		answer = b
		var he *HTTPError
		return retryAfter, errors.As(err, &he) && (he.Status == http.StatusTooManyRequests || he.Status >= 500), err
	})
	return answer, err // once gives no body with an error
}

func once(client *http.Client, req *http.Request) ([]byte, time.Duration, error) {
	resp, err := client.Do(req)
	if err != nil {
		// Without the URL: it can be long (vast.ai's query) and the
		// error names the server already.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, retryAfter(resp.Header.Get("Retry-After")), &HTTPError{Status: resp.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return nil, 0, err
	}
	if len(body) > maxAnswerBytes {
		return nil, 0, fmt.Errorf("answer larger than %d MiB", maxAnswerBytes>>20)
	}
	return body, 0, nil
}

// retryAfter parses a Retry-After header (seconds or an HTTP date).
func retryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if s, err := strconv.Atoi(h); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
