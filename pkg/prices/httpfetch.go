package prices

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/internal/httpretry"
)

// HTTPOptions are how the HTTP providers (vast.ai, Lambda, RunPod, Azure)
// call their API: every request, a page of a paged answer included, is
// retried on HTTP 429 and 5xx with capped exponential backoff and jitter,
// waiting at least what Retry-After says (up to MaxRetryAfter).
type HTTPOptions struct {
	// Client is the HTTP client (a 30 s timeout one if nil).
	Client *http.Client
	// MaxAttempts on HTTP 429 and 5xx; 0: 5.
	MaxAttempts int
	// MaxBackoff caps the exponential backoff between attempts; 0: 60 s.
	MaxBackoff time.Duration
	// MaxRetryAfter caps the wait a Retry-After header asks for (a rate
	// limit often asks for minutes); 0: DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// Sleep waits between attempts (tests replace it); nil: a timer that
	// ends early when ctx does.
	Sleep func(ctx context.Context, d time.Duration) error
}

// maxAnswerBytes bounds one answer (or page) read from a provider.
const maxAnswerBytes = 256 << 20

// get sends the request newReq builds, again on 429 and 5xx, and returns
// the body of the first 2xx answer. what names the provider in errors.
func (o HTTPOptions) get(ctx context.Context, what string, newReq func(context.Context) (*http.Request, error)) ([]byte, error) {
	client := o.Client
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	attempts := o.MaxAttempts
	if attempts <= 0 {
		attempts = 5
	}
	maxBackoff := o.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = time.Minute
	}
	maxRetryAfter := o.MaxRetryAfter
	if maxRetryAfter <= 0 {
		maxRetryAfter = DefaultMaxRetryAfter
	}
	sleep := o.Sleep
	if sleep == nil {
		sleep = sleepCtx
	}
	var body []byte
	err := httpretry.Do(ctx, what, httpretry.Policy{Attempts: attempts, MaxBackoff: maxBackoff, MaxRetryAfter: maxRetryAfter, Sleep: sleep},
		func(ctx context.Context) (time.Duration, bool, error) {
			b, retryAfter, err := o.once(ctx, client, newReq)
			body = b
			var he *HTTPError
			return retryAfter, errors.As(err, &he) && (he.Status == http.StatusTooManyRequests || he.Status >= 500), err
		})
	if err != nil {
		return nil, err
	}
	return body, nil
}

func (o HTTPOptions) once(ctx context.Context, client *http.Client, newReq func(context.Context) (*http.Request, error)) ([]byte, time.Duration, error) {
	req, err := newReq(ctx)
	if err != nil {
		return nil, 0, err
	}
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
