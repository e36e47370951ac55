package carbonwatch

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func emEntry(zone string, hour time.Time, g string) string {
	return fmt.Sprintf(`{"zone":%q,"carbonIntensity":%s,"datetime":%q,"updatedAt":"2026-11-24T12:04:00.000Z","emissionFactorType":"lifecycle","isEstimated":true}`,
		zone, g, hour.Format("2006-01-02T15:04:05.000Z"))
}

// fakeAPI serves ElectricityMaps' shapes from answers, which the test
// changes: path → body, or a status code to answer with instead.
type fakeAPI struct {
	mu      sync.Mutex
	history map[string]string // zone → body
	latest  map[string]string
	fail    []int // statuses to answer with first, one per request
	calls   int
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if r.Header.Get("auth-token") != "tok" {
		http.Error(w, "no token", http.StatusUnauthorized)
		return
	}
	if len(f.fail) > 0 {
		code := f.fail[0]
		f.fail = f.fail[1:]
		w.Header().Set("Retry-After", "3")
		http.Error(w, "busy", code)
		return
	}
	zone := r.URL.Query().Get("zone")
	var body string
	var ok bool
	switch r.URL.Path {
	case "/v3/carbon-intensity/history":
		body, ok = f.history[zone]
	case "/v3/carbon-intensity/latest":
		body, ok = f.latest[zone]
	}
	if !ok {
		http.Error(w, `{"error":"zone unknown"}`, http.StatusNotFound)
		return
	}
	fmt.Fprint(w, body)
}

func newWatcher(t *testing.T, api *fakeAPI, zones ...string) (*Watcher, *[]time.Duration) {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	w := New(Config{BaseURL: srv.URL + "/", Token: "tok", Zones: zones, Clock: clock.NewFake(t0)}, nil)
	var waits []time.Duration
	w.sleepFn = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	return w, &waits
}

func TestFetchHistoryAndLatest(t *testing.T) {
	api := &fakeAPI{
		history: map[string]string{"DE": fmt.Sprintf(`{"zone":"DE","history":[%s,%s,%s,%s,%s]}`,
			emEntry("DE", t0.Add(-2*time.Hour), "500"),
			emEntry("DE", t0.Add(-time.Hour), "400"),
			emEntry("DE", t0.Add(-3*time.Hour), "null"), // no data for that hour
			emEntry("FR", t0.Add(-3*time.Hour), "60"),   // another zone
			emEntry("DE", t0.Add(-4*time.Hour), "-5"))}, // nonsense
		latest: map[string]string{"DE": emEntry("DE", t0.Add(30*time.Minute), "100")}, // datetime inside the hour
	}
	w, _ := newWatcher(t, api, "DE")
	if err := w.Fetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.Zones["DE"].Hours != 3 || !st.Zones["DE"].Newest.Equal(t0) || st.Skipped != 3 || st.Failures != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, c := range []struct {
		at   time.Time
		want float64
		ok   bool
	}{
		{t0.Add(-90 * time.Minute), 500, true},
		{t0.Add(-time.Second), 400, true},
		{t0, 100, true},
		{t0.Add(119 * time.Minute), 100, true}, // not published yet: carried from 12:00
		{t0.Add(3 * time.Hour), 0, false},      // too old to carry
		{t0.Add(-3 * time.Hour), 0, false},     // the null hour is not known
		{t0.Add(-5 * time.Hour), 0, false},     // before anything
		{t0.Add(-150 * time.Minute), 0, false}, // 09:30: no earlier hour to carry
		{t0.Add(-2*time.Hour + time.Minute), 500, true},
	} {
		if g, ok := intensity(w, "DE", c.at); ok != c.ok || g != c.want {
			t.Errorf("%v: %v %v, want %v %v", c.at, g, ok, c.want, c.ok)
		}
	}
}

// A window across the hour is split in proportion to time, each part at its
// hour's intensity; a part in an hour not known goes to missing.
func TestSplitCarbonAtTheHour(t *testing.T) {
	api := &fakeAPI{
		history: map[string]string{"DE": fmt.Sprintf(`{"zone":"DE","history":[%s]}`, emEntry("DE", t0.Add(-time.Hour), "400"))},
		latest:  map[string]string{"DE": emEntry("DE", t0, "100")},
	}
	w, _ := newWatcher(t, api, "DE")
	if err := w.Fetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := map[float64]float64{}
	var missed float64
	add := func(g float64, src string, j float64) {
		if src != cost.CarbonSourceLive {
			t.Errorf("source %q", src)
		}
		got[g] += j
	}
	miss := func(_, _ time.Time, j float64) { missed += j }
	w.SplitCarbon("DE", t0.Add(-15*time.Second), t0.Add(45*time.Second), 600, add, miss)
	if math.Abs(got[400]-150) > 1e-9 || math.Abs(got[100]-450) > 1e-9 || missed != 0 {
		t.Errorf("split %v missed %v, want 150 J at 400 and 450 J at 100", got, missed)
	}
	// Hours 10:00 and before are unknown (no carry backwards).
	got, missed = map[float64]float64{}, 0
	w.SplitCarbon("DE", t0.Add(-61*time.Minute), t0.Add(-59*time.Minute), 120, add, miss)
	if math.Abs(missed-60) > 1e-9 || math.Abs(got[400]-60) > 1e-9 {
		t.Errorf("split %v missed %v, want 60 J missed and 60 J at 400", got, missed)
	}
	got, missed = map[float64]float64{}, 0
	w.SplitCarbon("PL", t0, t0.Add(time.Second), 5, add, miss)
	if missed != 5 {
		t.Errorf("a zone never fetched: missed %v", missed)
	}
}

// 429 and 5xx are retried with backoff (at least Retry-After); a malformed
// answer is not retried and keeps what was fetched before; one zone failing
// does not stop the others.
func TestRetriesAndBadAnswers(t *testing.T) {
	api := &fakeAPI{
		history: map[string]string{
			"DE": fmt.Sprintf(`{"zone":"DE","history":[%s]}`, emEntry("DE", t0, "100")),
			"FR": fmt.Sprintf(`{"zone":"FR","history":[%s]}`, emEntry("FR", t0, "50")),
		},
		latest: map[string]string{"DE": emEntry("DE", t0, "100"), "FR": emEntry("FR", t0, "50")},
		fail:   []int{http.StatusTooManyRequests, http.StatusBadGateway},
	}
	w, waits := newWatcher(t, api, "DE", "FR")
	if err := w.Fetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(*waits) != 2 || (*waits)[0] < 3*time.Second {
		t.Errorf("waits %v, want two, the first at least Retry-After's 3 s", *waits)
	}
	api.mu.Lock()
	api.history["DE"] = `{"zone":"DE","history":[`                                           // truncated
	api.latest["FR"] = `{"zone":"DE","carbonIntensity":1,"datetime":"2026-11-24T12:00:00Z"}` // the wrong zone
	calls := api.calls
	api.mu.Unlock()
	err := w.Fetch(t.Context())
	if err == nil || !strings.Contains(err.Error(), "zone DE") || !strings.Contains(err.Error(), "zone FR") || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("fetch of two bad answers: %v", err)
	}
	api.mu.Lock()
	if got := api.calls - calls; got != 3 { // DE history (bad, not retried); FR history, FR latest (bad)
		t.Errorf("%d requests, want 3 (bad answers are not retried)", got)
	}
	api.mu.Unlock()
	for z, want := range map[string]float64{"DE": 100, "FR": 50} {
		if g, ok := intensity(w, z, t0); !ok || g != want {
			t.Errorf("%s after a bad answer: %v %v, want the last good %v", z, g, ok, want)
		}
	}
	if st := w.Stats(); st.Failures != 2 || st.LastError == "" {
		t.Errorf("stats %+v", st)
	}
	// Unauthorised is not retried either.
	w.cfg.Token = "wrong"
	n := len(*waits)
	if err := w.Fetch(t.Context()); err == nil || !strings.Contains(err.Error(), "401") || len(*waits) != n {
		t.Errorf("401: %v, waits %v", err, *waits)
	}
}

// Start fetches at once and on every tick of the injected clock; Shutdown
// stops it.
func TestScheduleOnTheClock(t *testing.T) {
	api := &fakeAPI{
		history: map[string]string{"DE": `{"zone":"DE","history":[]}`},
		latest:  map[string]string{"DE": emEntry("DE", t0, "100")},
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	clk := clock.NewFake(t0)
	w := New(Config{BaseURL: srv.URL, Token: "tok", Zones: []string{"DE"}, Interval: time.Hour, Clock: clk}, nil)
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the first fetch", func() bool { return w.Stats().Fetches == 1 })
	api.mu.Lock()
	api.latest["DE"] = emEntry("DE", t0.Add(time.Hour), "90")
	api.mu.Unlock()
	clk.Advance(time.Hour) // the ticker exists once Start returned; the tick is delivered to the loop
	testkit.Eventually(t, "the scheduled fetch", func() bool { return w.Stats().Fetches == 2 })
	if g, ok := intensity(w, "DE", t0.Add(time.Hour)); !ok || g != 90 {
		t.Errorf("after the tick: %v %v", g, ok)
	}
	if err := w.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("no live source: %v", err)
	}
	err := Config{BaseURL: "ftp://x", Zones: []string{"D E"}, Interval: -1}.Validate()
	for _, want := range []string{"http(s) URL", "no spaces", "interval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: want %q", err, want)
		}
	}
	if err := (Config{BaseURL: "https://api.electricitymap.org"}).Validate(); err == nil || !strings.Contains(err.Error(), "no zone") {
		t.Errorf("no zone: %v", err)
	}
}

// intensity is zone's intensity in the hour that contains at.
func intensity(w *Watcher, zone string, at time.Time) (float64, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.lookup(zone, at.Truncate(time.Hour).Unix())
}
