package alert

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/pkg/clock"

	"github.com/trainmeter/trainmeter/internal/lifecycle"
)

// NSWebhookPending holds the deliveries not yet acknowledged, so that an
// alert queued when the collector stops is POSTed after it restarts.
const NSWebhookPending = "webhook-pending"

// WebhookConfig configures alert delivery.
type WebhookConfig struct {
	URLs []string // receive every alert as a JSON POST
	// MaxAttempts per alert and URL (network errors, 5xx and 429 are
	// retried, other 4xx not); 0: 8.
	MaxAttempts int
	// BaseBackoff is the first wait between attempts, doubled each time up
	// to MaxBackoff, with jitter; 0: 1 s and 1 min.
	BaseBackoff, MaxBackoff time.Duration
	Timeout                 time.Duration // of one POST; 0: 10 s
	// QueueSize per URL (an alert that finds it full is dropped); 0: 1000.
	QueueSize int
	Clock     clock.Clock // times the waits between attempts; nil: the wall clock
	// Rescan, when set, is how often running senders look in the store
	// for pending alerts that other collectors sharing it recorded while
	// not sending (package leader); 0: only at Start.
	Rescan time.Duration
}

// Validate checks the config.
func (c WebhookConfig) Validate() error {
	var errs []error
	for _, u := range c.URLs {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("webhook URL %q: want http(s)://host/path", u))
		}
	}
	if c.MaxAttempts < 0 || c.QueueSize < 0 || c.BaseBackoff < 0 || c.MaxBackoff < 0 || c.Timeout < 0 {
		errs = append(errs, errors.New("webhook retries, queue size, backoff and timeout must be >= 0"))
	}
	return errors.Join(errs...)
}

func (c WebhookConfig) withDefaults() WebhookConfig {
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 8)
	c.BaseBackoff = cmp.Or(c.BaseBackoff, time.Second)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, time.Minute)
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	c.QueueSize = cmp.Or(c.QueueSize, 1000)
	c.Clock = cmp.Or[clock.Clock](c.Clock, clock.Real{})
	return c
}

// Webhooks POSTs alerts to URLs: one goroutine and one bounded queue per
// URL (a slow receiver delays only itself), retries with capped exponential
// backoff and jitter. Alert never blocks.
//
// Every alert is first recorded pending in the store, which collectors of
// a fleet share; only running senders (those of the fleet's leader) POST.
// Start and Shutdown may alternate: a stop leaves the queued alerts
// pending for whichever senders run next, which queue each pending alert
// once.
type Webhooks struct {
	cfg    WebhookConfig
	store  storage.Records
	log    *slog.Logger
	client *http.Client
	hooks  []*hook

	mu      sync.Mutex
	running bool
	queued  map[string]bool // tag+id of the alerts queued or being delivered
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// busy counts the alerts queued or being delivered, over all URLs.
	busy atomic.Int64
}

type hook struct {
	url    string
	logURL string // without path, query and user info: webhook URLs often embed a secret
	tag    string // key prefix of its pending records
	queue  chan Alert
}

// NewWebhooks returns a sender; store may be nil (no redelivery after a restart).
func NewWebhooks(cfg WebhookConfig, store storage.Records, log *slog.Logger) *Webhooks {
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	cfg = cfg.withDefaults()
	w := &Webhooks{cfg: cfg, store: store, log: log, client: &http.Client{Timeout: cfg.Timeout}, queued: map[string]bool{}}
	seen := map[string]bool{}
	for _, u := range cfg.URLs {
		// A URL given twice is one receiver: two senders would POST each
		// alert to it twice and share one pending record.
		if seen[u] {
			log.Warn("webhook URL given more than once; it gets each alert once", "url", redactURL(u))
			continue
		}
		seen[u] = true
		h := sha256.Sum256([]byte(u))
		w.hooks = append(w.hooks, &hook{url: u, logURL: redactURL(u), tag: hex.EncodeToString(h[:6]) + "/", queue: make(chan Alert, cfg.QueueSize)})
	}
	return w
}

// Start queues what is pending and starts the senders (and, with Rescan,
// a look for new pending alerts every Rescan). ctx bounds only the start:
// the senders run until Shutdown.
func (w *Webhooks) Start(context.Context) error {
	ctx, cancel := context.WithCancel(context.Background())
	w.mu.Lock()
	w.running, w.cancel = true, cancel
	w.mu.Unlock()
	w.queuePending()
	for _, h := range w.hooks {
		w.wg.Go(func() { w.run(ctx, h) })
	}
	if w.cfg.Rescan > 0 && w.store != nil {
		t := w.cfg.Clock.NewTicker(w.cfg.Rescan)
		w.wg.Go(func() {
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C():
					w.queuePending()
				}
			}
		})
	}
	return nil
}

// queuePending queues the pending alerts not queued yet.
func (w *Webhooks) queuePending() {
	if w.store == nil {
		return
	}
	for _, h := range w.hooks {
		_ = w.store.ScanRecords(NSWebhookPending, h.tag, func(k string, v []byte) (bool, error) {
			var a Alert
			if json.Unmarshal(v, &a) == nil {
				w.mu.Lock()
				// Delivered since the scan read it (run deletes the
				// record with mu held): not queued again.
				if _, err := w.store.GetRecord(NSWebhookPending, k); err == nil {
					w.enqueueLocked(h, a)
				}
				w.mu.Unlock()
			}
			return true, nil
		})
	}
}

// Shutdown stops the senders (cancelling a POST in flight) and waits for them
// until ctx ends; undelivered alerts stay pending in the store.
func (w *Webhooks) Shutdown(ctx context.Context) error {
	w.mu.Lock()
	cancel := w.cancel
	w.running, w.cancel = false, nil
	w.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	stopped := make(chan struct{})
	go func() { w.wg.Wait(); close(stopped) }()
	if err := lifecycle.Wait(ctx, stopped, "webhook senders"); err != nil {
		return err
	}
	// What is still queued stays pending, for the next senders.
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.hooks {
		for len(h.queue) > 0 {
			<-h.queue
			w.busy.Add(-1)
		}
	}
	clear(w.queued)
	return nil
}

// Busy is how many alerts are queued or being delivered (retries
// included), over all URLs: 0 when the senders are idle. An alert left
// pending by a stop counts again once a sender re-queues it.
func (w *Webhooks) Busy() int { return int(w.busy.Load()) }

func (w *Webhooks) Alert(_ context.Context, a Alert) {
	for _, h := range w.hooks {
		if w.store != nil {
			if b, err := json.Marshal(a); err == nil {
				if err := w.store.PutRecord(NSWebhookPending, h.tag+a.ID, b); err != nil {
					w.log.Warn("webhook: cannot persist pending alert", "url", h.logURL, "err", err)
				}
			}
		}
		w.mu.Lock()
		if w.running {
			w.enqueueLocked(h, a)
		}
		w.mu.Unlock()
	}
}

// enqueueLocked queues a for h unless it is queued already or the queue
// is full, counting it busy. Call with mu held.
func (w *Webhooks) enqueueLocked(h *hook, a Alert) {
	k := h.tag + a.ID
	if w.queued[k] {
		return
	}
	select {
	case h.queue <- a:
		w.queued[k] = true
		w.busy.Add(1)
	default:
		w.log.Error("webhook queue full: alert dropped", "url", h.logURL, "alert", a.ID, "message", a.Message)
	}
}

func (w *Webhooks) run(ctx context.Context, h *hook) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-h.queue:
			done := w.deliver(ctx, h, a)
			w.mu.Lock()
			if done && w.store != nil {
				_ = w.store.DeleteRecord(NSWebhookPending, h.tag+a.ID)
			}
			delete(w.queued, h.tag+a.ID)
			w.mu.Unlock()
			w.busy.Add(-1)
		}
	}
}

// deliver POSTs a until a 2xx, a permanent failure, or the attempts run out;
// false: stopped (the alert stays pending).
func (w *Webhooks) deliver(ctx context.Context, h *hook, a Alert) bool {
	body, err := json.Marshal(a)
	if err != nil {
		return true
	}
	backoff := w.cfg.BaseBackoff
	for attempt := 1; ; attempt++ {
		retryAfter, err := w.post(ctx, h.url, a.ID, body)
		if err == nil {
			w.log.Debug("webhook delivered", "url", h.logURL, "alert", a.ID, "attempt", attempt)
			return true
		}
		if ctx.Err() != nil {
			return false // stopping: not the receiver's failure, keep it pending
		}
		var perm *permanentError
		if errors.As(err, &perm) || attempt >= w.cfg.MaxAttempts {
			w.log.Error("webhook delivery failed", "url", h.logURL, "alert", a.ID, "attempts", attempt, "err", err)
			return true
		}
		wait := min(max(backoff/2+rand.N(backoff/2+1), retryAfter), w.cfg.MaxBackoff)
		w.log.Warn("webhook delivery failed; retrying", "url", h.logURL, "alert", a.ID, "attempt", attempt, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-w.cfg.Clock.After(wait):
		}
		backoff = min(2*backoff, w.cfg.MaxBackoff)
	}
}

// redactURL keeps scheme and host of a webhook URL for logs (Slack-style URLs
// carry their secret in the path).
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return "(webhook)"
	}
	return p.Scheme + "://" + p.Host + "/…"
}

type permanentError struct{ status int }

func (e *permanentError) Error() string { return fmt.Sprintf("HTTP %d (not retried)", e.status) }

func (w *Webhooks) post(ctx context.Context, u, id string, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, &permanentError{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "trainmeter-collector")
	req.Header.Set("Idempotency-Key", id)
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL, which may hold a secret
		}
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
		return 0, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		ra := time.Duration(0)
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
			ra = time.Duration(s) * time.Second
		}
		return ra, fmt.Errorf("HTTP %d", resp.StatusCode)
	default:
		return 0, &permanentError{status: resp.StatusCode}
	}
}
