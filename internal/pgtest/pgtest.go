// Package pgtest starts a PostgreSQL server for a test package: initdb and
// pg_ctl in a temporary directory, listening on a unix socket there only,
// run as an unprivileged user when the tests run as root (initdb refuses
// root). Without PostgreSQL installed the tests skip, except under CI=true
// or TRAINMETER_REQUIRE_POSTGRES=1 (.ci/run), where they fail.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Server is a running PostgreSQL server.
type Server struct {
	dir, bin string
	opts     string // pg_ctl -o: the socket directory and settings
	cred     *syscall.Credential
}

var (
	shared  *Server
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

// binDir finds the directory of initdb: on PATH, else the newest under
// /usr/lib/postgresql (Debian's layout).
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		return "", errors.New("initdb not on PATH nor under /usr/lib/postgresql/*/bin")
	}
	return filepath.Dir(dirs[len(dirs)-1]), nil
}

// Start initialises and starts a server in a new temporary directory.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			return nil, fmt.Errorf("running as root, and no user nobody to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if err := s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.opts = fmt.Sprintf("-k %s -c listen_addresses='' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", dir)
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func (s *Server) start() error {
	if err := s.run("pg_ctl", "-D", s.data(), "-o", s.opts, "-l", filepath.Join(s.dir, "log"), "-w", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		return fmt.Errorf("%w\n%s", err, log)
	}
	return nil
}

// Restart stops the server as an operator's restart does (pg_ctl -m fast:
// sessions are ended, transactions in progress roll back, what committed
// stays), calls down while it is stopped, and starts it again on the same
// data directory and socket.
func (s *Server) Restart(down func()) error {
	if err := s.run("pg_ctl", "-D", s.data(), "-m", "fast", "-w", "stop"); err != nil {
		return err
	}
	down()
	return s.start()
}

func (s *Server) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, out)
	}
	return nil
}

// URL is the URL of database db on the server.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&sslmode=disable", db, s.dir)
}

// CreateDB creates database db and returns its URL.
func (s *Server) CreateDB(db string) (string, error) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return "", err
	}
	return s.URL(db), nil
}

// Stop stops the server and removes its directory.
func (s *Server) Stop() {
	_ = s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop")
	os.RemoveAll(s.dir)
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
func OwnServer(t testing.TB) (*Server, string) {
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
