package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/auth"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestSafeNext: a redirect target is a path on this console or "/": a
// single leading slash, no "//", no backslash and no control character,
// before or after percent-decoding (browsers drop TAB and newlines from
// URLs, so "/\t/evil.example" is "//evil.example" to them).
func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/runs":                  "/runs",
		"/runs?model=x&page=2":   "/runs?model=x&page=2",
		"/runs/a%20b":            "/runs/a%20b",
		"/compare?by=backend#g":  "/compare?by=backend#g",
		"":                       "/",
		"runs":                   "/",
		"//evil.example/":        "/",
		"/\t/evil.example":       "/",
		"/%09/evil.example":      "/",
		"/\n/evil.example":       "/",
		"/\r\n/evil.example":     "/",
		"/%0d%0a/evil.example":   "/",
		"/\\evil.example":        "/",
		"/%5Cevil.example":       "/",
		"\\\\evil.example":       "/",
		"/%2F/evil.example":      "/",
		"/%2f%2fevil.example":    "/",
		"https://evil.example/":  "/",
		"http:/evil.example":     "/",
		"/x\x00y":                "/",
		"/x\x7fy":                "/",
		"/x\u0085y":              "/",
		"/%zz":                   "/",
		"/runs//x":               "/",
		" /runs":                 "/",
		"/runs?next=//evil":      "/runs?next=//evil",
		"/runs?q=%2F%2Fevil":     "/runs?q=%2F%2Fevil",
		"/runs?q=a%09b":          "/",
		"/runs?q=a\\b":           "/",
		"/\u2028/evil.example":   "/",
		"/%E2%80%A8evil.example": "/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// loginConsole is a console with a read token "read-tok" on stub services
// (login needs none of them) and a fake clock for the throttle.
func loginConsole(t *testing.T) (*Console, *clock.Fake) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "read")
	if err := os.WriteFile(f, []byte("read-tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Config{ReadTokenFile: f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := New(Config{Listen: "127.0.0.1:0", Auth: a, Clock: clk, Services: Services{
		Query: trainmeterv1.UnimplementedQueryServiceServer{}, Budgets: trainmeterv1.UnimplementedBudgetServiceServer{},
		Prices: trainmeterv1.UnimplementedPriceServiceServer{}, Recommend: trainmeterv1.UnimplementedRecommendServiceServer{},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

func postLogin(c *Console, remote, token, next string, hdr map[string]string) *httptest.ResponseRecorder {
	body := url.Values{"token": {token}, "next": {next}}.Encode()
	req := httptest.NewRequest(http.MethodPost, "http://console.test:7434/login", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = remote
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, req)
	return w
}

// TestLoginRedirect: the case, next=/%09/evil.example (which the
// form posts back decoded, as "/\t/evil.example"), lands on "/".
func TestLoginRedirect(t *testing.T) {
	c, _ := loginConsole(t)
	for _, next := range []string{"/\t/evil.example", "/%09/evil.example", "//evil.example", "/\\evil.example"} {
		w := postLogin(c, "192.0.2.1:1000", "read-tok", next, nil)
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/" {
			t.Errorf("login with next=%q: %d → %q, want 303 to /", next, w.Code, w.Header().Get("Location"))
		}
	}
	if w := postLogin(c, "192.0.2.1:1000", "read-tok", "/nodes?x=1", nil); w.Header().Get("Location") != "/nodes?x=1" {
		t.Errorf("login with a local next: → %q, want /nodes?x=1", w.Header().Get("Location"))
	}
	// The form carries next as the value it will post back: the GET of
	// /login?next=/%09/evil.example puts "/" there, not the TAB.
	req := httptest.NewRequest(http.MethodGet, "http://console.test:7434/login?next=/%09/evil.example", nil)
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, req)
	if body := w.Body.String(); !strings.Contains(body, `name="next" value="/"`) {
		t.Errorf("login form for next=/%%09/evil.example does not carry \"/\":\n%s", body)
	}
}

// TestLoginCrossSite: a login posted from another origin (login CSRF: the
// victim's browser logged in with the attacker's token) is refused and sets
// no cookie; the console's own form, and clients that send neither header
// (curl, scripts), log in.
func TestLoginCrossSite(t *testing.T) {
	c, _ := loginConsole(t)
	for _, h := range []map[string]string{
		{"Origin": "http://evil.example"},
		{"Origin": "http://console.test:9999"},
		{"Origin": "null"},
		{"Origin": "http://console.test:7434", "Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
	} {
		w := postLogin(c, "192.0.2.2:1000", "read-tok", "/runs", h)
		if w.Code != http.StatusForbidden || w.Header().Get("Set-Cookie") != "" {
			t.Errorf("login with %v: %d, cookie %q; want 403 and no cookie", h, w.Code, w.Header().Get("Set-Cookie"))
		}
	}
	for _, h := range []map[string]string{
		nil,
		{"Origin": "http://console.test:7434", "Sec-Fetch-Site": "same-origin"},
		{"Origin": "http://CONSOLE.test:7434"},
		{"Sec-Fetch-Site": "same-origin"},
		{"Sec-Fetch-Site": "none"},
	} {
		w := postLogin(c, "192.0.2.2:1000", "read-tok", "/runs", h)
		if w.Code != http.StatusSeeOther || !strings.Contains(w.Header().Get("Set-Cookie"), tokenCookie+"=read-tok") {
			t.Errorf("login with %v: %d, cookie %q; want 303 and the cookie", h, w.Code, w.Header().Get("Set-Cookie"))
		}
	}
	// Logging someone out from another site is refused as well.
	req := httptest.NewRequest(http.MethodPost, "http://console.test:7434/logout", nil)
	req.Header.Set("Origin", "http://evil.example")
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, req)
	if w.Code != http.StatusForbidden {
		t.Errorf("cross-site logout: %d, want 403", w.Code)
	}
}

// TestLoginThrottle: failed logins from one client are limited (a burst,
// then one per refill interval), answered 429 with Retry-After, even with
// the right token while the client is limited; other clients are not
// affected; time refills the bucket.
func TestLoginThrottle(t *testing.T) {
	c, clk := loginConsole(t)
	const attacker, other = "198.51.100.7:4000", "203.0.113.9:5000"
	var codes []int
	for range 300 {
		codes = append(codes, postLogin(c, attacker, "wrong", "/", nil).Code)
	}
	for i, code := range codes {
		want := http.StatusUnauthorized
		if i >= loginBurst {
			want = http.StatusTooManyRequests
		}
		if code != want {
			t.Fatalf("failed login %d of 300: %d, want %d (burst %d)", i+1, code, want, loginBurst)
		}
	}
	w := postLogin(c, attacker, "read-tok", "/", nil)
	if w.Code != http.StatusTooManyRequests {
		t.Errorf("right token while limited: %d, want 429", w.Code)
	}
	if ra := w.Header().Get("Retry-After"); ra != "6" {
		t.Errorf("Retry-After %q, want 6 (s until the next try)", ra)
	}
	// The same host on another port is the same client.
	if w := postLogin(c, "198.51.100.7:4001", "read-tok", "/", nil); w.Code != http.StatusTooManyRequests {
		t.Errorf("same host, other port: %d, want 429", w.Code)
	}
	if w := postLogin(c, other, "read-tok", "/", nil); w.Code != http.StatusSeeOther {
		t.Errorf("another client: %d, want 303 (not limited)", w.Code)
	}
	clk.Advance(loginRefill)
	if w := postLogin(c, attacker, "read-tok", "/", nil); w.Code != http.StatusSeeOther {
		t.Errorf("after %v: %d, want 303", loginRefill, w.Code)
	}
	if w := postLogin(c, attacker, "wrong", "/", nil); w.Code != http.StatusUnauthorized {
		t.Errorf("one more failure after the refill: %d, want 401", w.Code)
	}
	if w := postLogin(c, attacker, "wrong", "/", nil); w.Code != http.StatusTooManyRequests {
		t.Errorf("a second failure: %d, want 429", w.Code)
	}
	// IPv6 clients are limited per /64: a host rotates addresses in it.
	for i := range loginBurst {
		postLogin(c, "[2001:db8::"+string(rune('a'+i%6))+"]:1", "wrong", "/", nil)
	}
	if w := postLogin(c, "[2001:db8::ffff]:1", "wrong", "/", nil); w.Code != http.StatusTooManyRequests {
		t.Errorf("another address of the same /64: %d, want 429", w.Code)
	}
}

// TestLoginLimiterBounded: the limiter tracks at most loginClients
// clients; beyond that, new clients share one bucket (still limited), and
// clients whose buckets refilled are forgotten.
func TestLoginLimiterBounded(t *testing.T) {
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	l := newLoginLimiter(clk)
	for i := range loginClients + 100 {
		l.fail("c" + string(rune(i)))
	}
	if n := len(l.clients); n > loginClients+1 {
		t.Errorf("tracking %d clients, want at most %d", n, loginClients+1)
	}
	clk.Advance(loginRefill * loginBurst)
	l.fail("fresh")
	if n := len(l.clients); n > 2 {
		t.Errorf("after a full refill, tracking %d clients, want the refilled ones forgotten", n)
	}
}
