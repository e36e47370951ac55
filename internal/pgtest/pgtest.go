// Package pgtest starts a PostgreSQL server (internal/pgserver) for a test
// package. Without PostgreSQL installed the tests skip, except under CI=true
// or TRAINMETER_REQUIRE_POSTGRES=1 (.ci/run), where they fail.
package pgtest

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/trainmeter/trainmeter/internal/pgserver"
)

var (
	shared  *pgserver.Server
	missing string // why there is no server
	dbSeq   atomic.Int64
)

// Main starts a server, runs the package's tests and stops it: call it from
// TestMain.
func Main(m *testing.M) {
	s, err := Start()
	if err != nil {
		if required() {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			os.Exit(1)
		}
		missing = err.Error()
	}
	shared = s
	code := m.Run()
	if s != nil {
		s.Stop()
	}
	os.Exit(code)
}

// required: a missing PostgreSQL fails the tests.
func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("TRAINMETER_REQUIRE_POSTGRES") == "1"
}

// DB returns the URL of a new empty database on the package's server, or
// skips the test when there is none.
func DB(t testing.TB) string {
	t.Helper()
	if shared == nil {
		t.Skipf("no PostgreSQL (%s); CI=true makes this a failure", missing)
	}
	url, err := shared.CreateDB(fmt.Sprintf("t%d", dbSeq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// Start starts a server for tests: no fsync (a test's data need not
// survive a crash), room for many connections.
func Start() (*pgserver.Server, error) {
	return pgserver.Start("", "fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=200")
}

// ServerDB starts a server of the test's own (a package whose TestMain is
// not Main), stopped at cleanup, and returns the URL of an empty database
// on it; without PostgreSQL it skips, or fails under CI=true.
func ServerDB(t testing.TB) string {
	t.Helper()
	_, url := OwnServer(t)
	return url
}

// OwnServer is ServerDB that also returns the server, for a test that
// restarts it.
func OwnServer(t testing.TB) (*pgserver.Server, string) {
	t.Helper()
	s, err := Start()
	if err != nil {
		if required() {
			t.Fatal("pgtest: ", err)
		}
		t.Skipf("no PostgreSQL (%v); CI=true makes this a failure", err)
	}
	t.Cleanup(s.Stop)
	url, err := s.CreateDB("trainmeter")
	if err != nil {
		t.Fatal(err)
	}
	return s, url
}
