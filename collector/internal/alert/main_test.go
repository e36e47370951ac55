package alert

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir, store.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func start(t *testing.T, w *Webhooks) {
	t.Helper()
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// shutdown stops w and waits for its senders; calling it again is a no-op
// wait.
func shutdown(t *testing.T, w *Webhooks) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
