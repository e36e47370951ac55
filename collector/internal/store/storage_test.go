package store_test

import (
	"io"
	"log/slog"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/storage/storagetest"
	"github.com/trainmeter/trainmeter/collector/internal/store"
)

// reopenable is a store the suite can restart on its directory.
type reopenable struct {
	*store.Store
	dir string
	o   storagetest.Options
}

func openDir(t *testing.T, dir string, o storagetest.Options) *store.Store {
	t.Helper()
	s, err := store.Open(dir, store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: o.Limits, Clock: o.Clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() }) // a second Close only says so
	return s
}

func (r *reopenable) Reopen(t *testing.T) storage.Store {
	if err := r.Store.Close(); err != nil {
		t.Fatal(err)
	}
	r.Store = openDir(t, r.dir, r.o)
	return r
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T, o storagetest.Options) storage.Store {
		r := &reopenable{dir: t.TempDir(), o: o}
		r.Store = openDir(t, r.dir, o)
		return r
	})
}
