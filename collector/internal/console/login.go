package console

import (
	"errors"
	"math"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Failed logins are limited per client with a token bucket: loginBurst
// failures at once, then one more each loginRefill (10 a minute), so
// guessing a token over the form is as slow as the bucket, and a person who
// mistyped a few times is not held up. A limited client gets 429 with
// Retry-After without its token being checked.
const (
	loginBurst   = 10
	loginRefill  = 6 * time.Second
	loginClients = 4096 // clients tracked at once; beyond, they share one bucket
)

// overflowClient is the bucket every untracked client shares once
// loginClients are tracked: a flood of addresses is limited as one.
const overflowClient = "*"

type loginBucket struct {
	tokens float64
	at     time.Time
}

// loginLimiter counts failed logins per client (an IPv4 address, or an
// IPv6 /64: one host can take any address of its /64).
type loginLimiter struct {
	clk       clock.Clock
	mu        sync.Mutex
	clients   map[string]*loginBucket
	lastPrune time.Time
}

func newLoginLimiter(clk clock.Clock) *loginLimiter {
	return &loginLimiter{clk: clk, clients: map[string]*loginBucket{}}
}

// refilled is b's tokens at now, at most loginBurst.
func (b *loginBucket) refilled(now time.Time) float64 {
	return min(loginBurst, b.tokens+float64(now.Sub(b.at))/float64(loginRefill))
}

// wait is how long client must wait before its next try; 0: it may try now.
func (l *loginLimiter) wait(client string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	b, ok := l.clients[client]
	if !ok {
		if b, ok = l.clients[overflowClient]; !ok || len(l.clients) < loginClients {
			return 0
		}
	}
	tok := b.refilled(now)
	if tok >= 1 {
		return 0
	}
	return time.Duration((1 - tok) * float64(loginRefill))
}

// fail spends one of client's tries.
func (l *loginLimiter) fail(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	b, ok := l.clients[client]
	if !ok {
		if len(l.clients) >= loginClients && now.Sub(l.lastPrune) >= loginRefill {
			// Forget clients whose buckets are full again: they are
			// where an untracked client starts.
			l.lastPrune = now
			for k, v := range l.clients {
				if v.refilled(now) >= loginBurst {
					delete(l.clients, k)
				}
			}
		}
		if len(l.clients) >= loginClients {
			client = overflowClient
		}
		if b, ok = l.clients[client]; !ok {
			b = &loginBucket{tokens: loginBurst, at: now}
			l.clients[client] = b
		}
	}
	b.tokens, b.at = max(0, b.refilled(now)-1), now
}

// clientOf is the key a request's failed logins are counted under: the
// peer's IPv4 address or IPv6 /64. A proxy in front makes every client
// one; the limit then holds for all of them together.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// retryAfter is d in whole seconds, rounded up, for a Retry-After header.
func retryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

var errCrossSite = errors.New("cross-site request refused: log in from the console's own login form")

// sameOrigin refuses a state-changing request a page of another site made
// the browser send (login CSRF: the victim's browser logged in with the
// attacker's token, so what the victim then does is in the attacker's
// session). Browsers send Origin with every POST and Sec-Fetch-Site with
// every request; Origin must name this console (the Host the browser
// sent, which a page cannot set) and Sec-Fetch-Site, when present, must
// say same-origin (or none: typed by the user). A client that sends
// neither (curl, a script) is not a browser a page can drive, and passes.
func sameOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) {
			return errCrossSite
		}
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return errCrossSite
	}
	return nil
}

// safeNext keeps a redirect target on this console: a path with a single
// leading "/", no "//" and no backslash in the path, and no control or
// other non-printing character anywhere, checked as sent and once
// percent-decoded; anything else is "/". Browsers drop TAB and newlines
// from a URL and read "\" as "/", so "/\t/evil.example" and "/\evil" would
// leave for another host.
func safeNext(s string) string {
	dec, err := url.PathUnescape(s)
	if err != nil || !localTarget(s) || !localTarget(dec) {
		return "/"
	}
	return s
}

func localTarget(s string) bool {
	if !strings.HasPrefix(s, "/") || !utf8.ValidString(s) || strings.ContainsRune(s, '\\') {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) && r != ' ' {
			return false
		}
	}
	path := s
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	return !strings.Contains(path, "//")
}
