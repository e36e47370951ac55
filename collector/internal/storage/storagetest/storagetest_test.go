package storagetest_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/storage/storagetest"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func openDir(t *testing.T, dir string, o storagetest.Options) *store.Store {
	t.Helper()
	s, err := store.Open(dir, store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: o.Limits, Clock: o.Clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// resends applies every batch under a key of its own: a resend is applied
// again.
type resends struct {
	*store.Store
	n atomic.Int64
}

func (r *resends) ApplyBatchResult(s storage.Sender, b *trainmeterv1.Batch) (storage.Applied, error) {
	s.Boot += fmt.Sprint(r.n.Add(1))
	return r.Store.ApplyBatchResult(s, b)
}

// pagesFromStart ignores the cursor.
type pagesFromStart struct{ *store.Store }

func (p pagesFromStart) RunsAfter(_ string, limit int) ([]*aggregate.State, error) {
	return p.Store.RunsAfter("", limit)
}

// forgetsDeleted leaves deleted runs' windows out of usage.
type forgetsDeleted struct{ *store.Store }

func (f forgetsDeleted) UsageScan(since, until time.Time, gpu func(string, *trainmeterv1.Batch) error,
	run func(string, string, *trainmeterv1.RunWindow) error, _ func(string, *storev1.DeletedRunWindow) error) error {
	return f.Store.UsageScan(since, until, gpu, run, func(string, *storev1.DeletedRunWindow) error { return nil })
}

// amnesic reopens on an empty directory.
type amnesic struct{ *store.Store }

func (a *amnesic) Reopen(t *testing.T) storage.Store {
	a.Store = openDir(t, t.TempDir(), storagetest.Options{})
	return a
}

// broken are stores that break the contract, and a subtest that must
// fail on each.
var broken = map[string]struct {
	open func(*testing.T, storagetest.Options) storage.Store
	want string
}{
	"resend applied again": {func(t *testing.T, o storagetest.Options) storage.Store {
		return &resends{Store: openDir(t, t.TempDir(), o)}
	}, "ApplyOnce"},
	"pages ignore cursor": {func(t *testing.T, o storagetest.Options) storage.Store {
		return pagesFromStart{openDir(t, t.TempDir(), o)}
	}, "Pages"},
	"deleted not in usage": {func(t *testing.T, o storagetest.Options) storage.Store {
		return forgetsDeleted{openDir(t, t.TempDir(), o)}
	}, "UsageAndDelete"},
	"restart loses data": {func(t *testing.T, o storagetest.Options) storage.Store {
		return &amnesic{openDir(t, t.TempDir(), o)}
	}, "Reopen"},
	"limits ignored": {func(t *testing.T, o storagetest.Options) storage.Store {
		return openDir(t, t.TempDir(), storagetest.Options{Clock: o.Clock})
	}, "LiveRunsLimit"},
}

const brokenEnv = "STORAGETEST_BROKEN"

// TestSuiteFailsBrokenStores runs the suite on each broken store in a
// child process (a failed subtest fails its parent) and wants it to fail
// the subtest that checks what the store breaks.
func TestSuiteFailsBrokenStores(t *testing.T) {
	if name := os.Getenv(brokenEnv); name != "" {
		storagetest.Run(t, broken[name].open)
		return
	}
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestSuiteFailsBrokenStores$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a store whose %s:\n%s", name, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestSuiteFailsBrokenStores/"+b.want+" ") {
				t.Fatalf("the suite did not fail %s on a store whose %s:\n%s", b.want, name, out)
			}
		})
	}
}
