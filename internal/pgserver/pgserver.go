// Package pgserver starts a throwaway PostgreSQL server: initdb and pg_ctl
// in a new temporary directory, listening on a unix socket there only, run
// as the unprivileged user nobody when the caller is root (initdb refuses
// root). Tests (internal/pgtest) and the load generator use it.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// Server is a running PostgreSQL server.
type Server struct {
	dir, bin string
	opts     string // pg_ctl -o: the socket directory and settings
	cred     *syscall.Credential
}

// BinDir finds the directory of initdb: on PATH, else the newest under
// /usr/lib/postgresql (Debian's layout).
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		return "", errors.New("initdb not on PATH nor under /usr/lib/postgresql/*/bin")
	}
	return filepath.Dir(dirs[len(dirs)-1]), nil
}

// Start initialises and starts a server in a new temporary directory with
// the binaries of bin (empty: BinDir) and the given settings (each a
// "name=value" passed to the server as -c).
func Start(bin string, settings ...string) (*Server, error) {
	if bin == "" {
		var err error
		if bin, err = BinDir(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "pgserver-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, and no user nobody to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := s.run("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	opts := []string{"-k", dir, "-c", "listen_addresses=''"}
	for _, kv := range settings {
		opts = append(opts, "-c", kv)
	}
	s.opts = strings.Join(opts, " ")
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
