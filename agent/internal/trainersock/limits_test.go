package trainersock

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// otherUID is the uid the lock-out test's second tenant connects as
// (nobody on Debian).
const otherUID = 65534

// dialAs connects to path as uid (effective uid, which SO_PEERCRED
// reports): the connect runs on a locked OS thread whose effective uid is
// changed with a raw setresuid, which changes that thread only. The thread
// is never unlocked, so it ends with the goroutine and no other code runs
// under that uid. Needs root.
func dialAs(t *testing.T, path string, uid int) *client {
	t.Helper()
	type res struct {
		c   *net.UnixConn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			ch <- res{err: e}
			return
		}
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		ch <- res{c, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("connect as uid %d: %v", uid, r.err)
	}
	t.Cleanup(func() { r.c.Close() })
	return &client{t: t, c: r.c, br: bufio.NewReader(r.c)}
}

// TestSocketLockOut: idle connections from one uid cannot lock trainers out
// of the socket. With a cap of 8 connections per uid, 20 idle connections
// from one uid get 8 in and 12 refused (each with an error line, counted in
// ConnsRejected under "uid_conns"); a trainer of another uid still
// connects and starts a run; after the idle timeout (fake clock) the 8
// connections that never sent run_start are closed, while the other uid's
// started connection stays, and the first uid's trainer gets in again.
func TestSocketLockOut(t *testing.T) {
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := newRecorder()
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.sock")
	s := start(t, Config{Path: path, Mode: 0o666, MaxConnsPerUID: 8, IdleTimeout: 30 * time.Second, Clock: clk}, rec)
	me := os.Getuid()

	var idle []*client
	for range 20 {
		idle = append(idle, dial(t, path))
	}
	want := errLine("too many connections from uid "+strconv.Itoa(me)+" (limit 8)", 0)
	for i, c := range idle[8:] {
		c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		l, err := c.br.ReadString('\n')
		if err != nil || l != want {
			t.Fatalf("idle connection %d of 20: %q, %v; want %q and a close", 9+i, l, err, want)
		}
		c.expectEOF()
	}
	idle = idle[:8]
	st := s.Stats()
	if st.ConnsActive != 8 || st.ConnsRejected != 12 || st.Rejected["uid_conns"] != 12 {
		t.Fatalf("after 20 idle connections: active %d, rejected %d (%v); want 8 and 12 uid_conns", st.ConnsActive, st.ConnsRejected, st.Rejected)
	}

	// Another tenant is not locked out.
	if me == 0 {
		// The socket's directories must let the other uid reach it.
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		o := dialAs(t, path, otherUID)
		o.send(`{"event":"run_start","run_id":"other-tenant","model":"m","gpus":[0]}`)
		testkit.Eventually(t, "the other uid's run_start", func() bool { return rec.numEvents() == 1 })
		if p := rec.snapshot()[0].peer; p.UID != otherUID {
			t.Fatalf("the other tenant's peer: %+v, want uid %d", p, otherUID)
		}
	} else {
		t.Log("not root: the other-uid connection is not tried")
	}

	// Idle connections are closed after the timeout; the started one is not.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clk.AwaitWaiters(ctx, 8); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second)
	wantIdle := errLine("no run_start within 30s: closing", 0)
	for i, c := range idle {
		c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		l, err := c.br.ReadString('\n')
		if err != nil || l != wantIdle {
			t.Fatalf("idle connection %d after the timeout: %q, %v; want %q", i+1, l, err, wantIdle)
		}
		c.expectEOF()
	}
	wantActive := 0 // the other tenant's started connection, when tried
	if me == 0 {
		wantActive = 1
	}
	testkit.Eventually(t, "idle connections gone", func() bool { return s.Stats().ConnsActive == wantActive })
	if st := s.Stats(); st.IdleClosed != 8 {
		t.Errorf("IdleClosed = %d, want 8", st.IdleClosed)
	}
	c := dial(t, path)
	c.send(`{"event":"run_start","run_id":"same-uid-again","model":"m","gpus":[0]}`)
	testkit.Eventually(t, "the first uid's trainer after the timeout", func() bool {
		for _, e := range rec.snapshot() {
			if e.ev.RunID() == "same-uid-again" {
				return true
			}
		}
		return false
	})
	// A started connection is not timed out.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	_ = clk.AwaitWaiters(ctx2, 1)
	clk.Advance(time.Hour)
	c.send(`{"event":"step","run_id":"same-uid-again","step":1,"tokens":10}`)
	testkit.Eventually(t, "a step on the started connection an hour later", func() bool {
		for _, e := range rec.snapshot() {
			if _, ok := e.ev.(*trainerproto.Step); ok {
				return true
			}
		}
		return false
	})
}

// TestPeerCredFailureRefused: a connection whose SO_PEERCRED cannot be read
// is refused (its uid is unknown, so neither the allow-list nor the per-uid
// cap nor run ownership can be applied), and counted.
func TestPeerCredFailureRefused(t *testing.T) {
	old := readPeerCred
	readPeerCred = func(*net.UnixConn) (int32, int32, int32, error) {
		return -1, -1, -1, errors.New("getsockopt: bad file descriptor")
	}
	t.Cleanup(func() { readPeerCred = old })
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)
	if got, want := c.readLine(), errLine("the agent cannot tell who connected (SO_PEERCRED failed): refused", 0); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	c.expectEOF()
	if n := rec.numEvents(); n != 0 {
		t.Errorf("%d events from an unidentified peer reached the handler", n)
	}
	if st := s.Stats(); st.ConnsRejected != 1 || st.Rejected["no_peer_cred"] != 1 || st.ConnsAccepted != 0 {
		t.Errorf("stats: rejected %d (%v), accepted %d; want one no_peer_cred rejection", st.ConnsRejected, st.Rejected, st.ConnsAccepted)
	}
}
