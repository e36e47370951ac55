package store

import (
	"strings"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

// rawSet writes k=v into the badger database in dir, bypassing Open.
func rawSet(t *testing.T, dir, k, v string) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(k), []byte(v)) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// A store knows its format: a data directory written in another one, or
// holding data without one, is refused by name with the way out; a new or
// current one opens (and reopens).
func TestOpenRefusesAnotherStoreFormat(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	applyWant(t, s, Sender{Node: "n", Boot: "b"}, batch(1, "r", 1, 10, 1, runStart("r", 0)), false)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	if _, err := s.GetRun("r"); err != nil {
		t.Fatalf("reopened store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	other := t.TempDir()
	s = open(t, other)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rawSet(t, other, "m/format", "999")

	unversioned := t.TempDir()
	rawSet(t, unversioned, "a/r", "")

	for _, tc := range []struct{ dir, want string }{
		{other, "store format 999"},
		{unversioned, "no store format"},
	} {
		s, err := Open(tc.dir, Options{Logger: quiet()})
		if err == nil {
			s.Close()
			t.Fatalf("Open(%s) succeeded, want it refused", tc.dir)
		}
		for _, want := range []string{tc.dir, tc.want, "move it aside"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open(%s): %v, want it to say %q", tc.dir, err, want)
			}
		}
	}
}
