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
	data := filepath.Join(dir, "data")
	if err := s.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	opts := []string{"-k", dir, "-c", "listen_addresses=''"}
	for _, kv := range settings {
		opts = append(opts, "-c", kv)
	}
	if err := s.run("pg_ctl", "-D", data, "-o", strings.Join(opts, " "), "-l", filepath.Join(dir, "log"), "-w", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	return s, nil
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
	_ = s.run("pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "immediate", "-w", "stop")
	os.RemoveAll(s.dir)
}
