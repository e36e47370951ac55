package carbonwatch

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/leader"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// fleetLock is a leader lock that one member of a fleet in this process
// holds at a time (as PostgreSQL's advisory lock across collectors).
type fleetLock struct {
	mu     sync.Mutex
	holder *memberLock
}

type memberLock struct{ f *fleetLock }

func (m *memberLock) TryLock(context.Context) (<-chan struct{}, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if m.f.holder != nil && m.f.holder != m {
		return nil, nil
	}
	m.f.holder = m
	return make(chan struct{}), nil
}

func (m *memberLock) Unlock(context.Context) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if m.f.holder == m {
		m.f.holder = nil
	}
	return nil
}

// TestFetchedOnceForTheFleet: two collectors over one store, each with its
// watcher as a leader task. Only the leader asks the API; the follower
// books the same intensity for each hour once it reloads; when the leader
// goes, the follower takes over and its fetch adds to the stored hours,
// including those the old leader stored after the follower's last reload.
func TestFetchedOnceForTheFleet(t *testing.T) {
	api := &fakeAPI{
		history: map[string]string{"DE": `{"zone":"DE","history":[` + emEntry("DE", t0.Add(-2*time.Hour), "50") + "," + emEntry("DE", t0.Add(-time.Hour), "60") + `]}`},
		latest:  map[string]string{"DE": emEntry("DE", t0, "70")},
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	calls := func() int { api.mu.Lock(); defer api.mu.Unlock(); return api.calls }
	answer := func(hour time.Time, g string) {
		api.mu.Lock()
		defer api.mu.Unlock()
		api.history["DE"], api.latest["DE"] = `{"zone":"DE","history":[]}`, emEntry("DE", hour, g)
	}

	st, err := store.Open(t.TempDir(), store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	clk := clock.NewFake(t0)
	lock := &fleetLock{}
	member := func() (*Watcher, *leader.Elector) {
		w := New(Config{BaseURL: srv.URL, Token: "tok", Zones: []string{"DE"}, Interval: time.Hour, Clock: clk}, nil)
		if err := w.SetStore(st); err != nil {
			t.Fatal(err)
		}
		e := leader.New(leader.Config{Lock: &memberLock{lock}, Clock: clk, Tasks: []leader.Task{w}})
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		return w, e
	}
	a, ea := member()
	b, eb := member()
	defer func() { _ = eb.Shutdown(context.Background()) }()
	if !ea.Leading() || eb.Leading() {
		t.Fatalf("leading: a %v b %v, want a alone", ea.Leading(), eb.Leading())
	}
	testkit.Eventually(t, "the leader's first fetch", func() bool { return a.Stats().Fetches == 1 })
	if got := calls(); got != 2 || b.Stats().Fetches != 0 {
		t.Fatalf("API calls %d (want 2: history and latest of the leader), follower fetches %d", got, b.Stats().Fetches)
	}
	if _, ok := intensity(b, "DE", t0.Add(-2*time.Hour)); ok {
		t.Fatal("the follower knows an hour before reloading")
	}
	if err := b.Reload(); err != nil {
		t.Fatal(err)
	}
	for h, want := range map[int]float64{-2: 50, -1: 60, 0: 70} {
		at := t0.Add(time.Duration(h) * time.Hour)
		ga, oka := intensity(a, "DE", at)
		gb, okb := intensity(b, "DE", at)
		if !oka || !okb || ga != want || gb != want {
			t.Errorf("hour %+d: leader %v %v, follower %v %v, want %v both", h, ga, oka, gb, okb, want)
		}
	}

	// The leader's scheduled fetch, which the follower does not reload.
	answer(t0.Add(time.Hour), "80")
	clk.Advance(time.Hour)
	testkit.Eventually(t, "the leader's scheduled fetch", func() bool { return a.Stats().Fetches == 2 })
	if got := calls(); got != 4 {
		t.Fatalf("API calls %d, want 4", got)
	}
	// The leader goes; the follower takes the lock on its next try.
	if err := ea.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	answer(t0.Add(2*time.Hour), "90")
	testkit.Eventually(t, "the takeover", func() bool { clk.Advance(leader.DefaultRetry); return eb.Leading() })
	testkit.Eventually(t, "the new leader's fetch", func() bool { return b.Stats().Fetches == 1 })
	if got := calls(); got != 6 {
		t.Errorf("API calls %d, want 6", got)
	}
	c := New(Config{BaseURL: srv.URL, Token: "tok", Zones: []string{"DE"}, Clock: clk}, nil)
	if err := c.SetStore(st); err != nil {
		t.Fatal(err)
	}
	for h, want := range map[int]float64{-2: 50, -1: 60, 0: 70, 1: 80, 2: 90} {
		at := t0.Add(time.Duration(h) * time.Hour)
		gb, okb := intensity(b, "DE", at)
		gc, okc := intensity(c, "DE", at)
		if !okb || !okc || gb != want || gc != want {
			t.Errorf("after the takeover, hour %+d: new leader %v %v, stored %v %v, want %v both", h, gb, okb, gc, okc, want)
		}
	}
	if c.Stats().Zones["DE"].Hours != 5 {
		t.Errorf("stored hours %+v, want 5", c.Stats().Zones["DE"])
	}
}
