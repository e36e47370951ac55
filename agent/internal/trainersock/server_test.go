package trainersock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// recorder is a Handler that records everything it is given.
type recorder struct {
	mu     sync.Mutex
	events []recorded
	disc   map[uint64]int // ConnID -> Disconnected calls
	steps  int
	perCon map[uint64][]uint64 // step numbers per connection
}

type recorded struct {
	peer Peer
	ev   trainerproto.Event
}

func newRecorder() *recorder {
	return &recorder{disc: map[uint64]int{}, perCon: map[uint64][]uint64{}}
}

func (r *recorder) Handle(p Peer, ev trainerproto.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{p, ev})
	if st, ok := ev.(*trainerproto.Step); ok {
		r.steps++
		if st.Step != nil {
			r.perCon[p.ConnID] = append(r.perCon[p.ConnID], *st.Step)
		}
	}
	if ev.RunID() == "reject-me" {
		return errors.New("run reject-me: rejected by handler")
	}
	return nil
}

func (r *recorder) Disconnected(p Peer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disc[p.ConnID]++
}

func (r *recorder) snapshot() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.events...)
}

func (r *recorder) numEvents() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *recorder) numDisconnected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.disc)
}

func sockPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), "agent.sock")
}

func start(t *testing.T, cfg Config, h Handler) *Server {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = sockPath(t)
	}
	s, err := New(cfg, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return s
}

type client struct {
	t  *testing.T
	c  *net.UnixConn
	br *bufio.Reader
}

func dial(t *testing.T, path string) *client {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *client) send(lines ...string) {
	c.t.Helper()
	for _, l := range lines {
		if _, err := c.c.Write([]byte(l + "\n")); err != nil {
			c.t.Fatalf("write: %v", err)
		}
	}
}

func (c *client) readLine() string {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	l, err := c.br.ReadString('\n')
	if err != nil {
		c.t.Fatalf("read: %v (got %q)", err, l)
	}
	return l
}

func (c *client) expectEOF() {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	l, err := c.br.ReadString('\n')
	if err == nil || l != "" {
		c.t.Fatalf("want EOF, got %q, %v", l, err)
	}
}

func TestEventsInOrderAndPeerCred(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)
	c.send(`{"event":"run_start","run_id":"r1","model":"m","gpus":[0,"GPU-abc"],"team":"nlp"}`)
	for i := 1; i <= 50; i++ {
		c.send(fmt.Sprintf(`{"event":"step","run_id":"r1","step":%d,"tokens":%d}`, i, i*10))
	}
	c.send(`{"event":"eval","run_id":"r1","epoch":1,"val_loss":1.5}`, `{"event":"run_end","run_id":"r1"}`)
	testkit.Eventually(t, "53 events", func() bool { return rec.numEvents() == 53 })

	evs := rec.snapshot()
	if rs, ok := evs[0].ev.(*trainerproto.RunStart); !ok || rs.Start.Metadata.Model != "m" || rs.Start.Labels["team"] != "nlp" || len(rs.GPUs) != 2 {
		t.Fatalf("first event %#v", evs[0].ev)
	}
	for i := 1; i <= 50; i++ {
		st, ok := evs[i].ev.(*trainerproto.Step)
		if !ok || *st.Step != uint64(i) || st.Tokens != uint64(i*10) {
			t.Fatalf("event %d = %#v", i, evs[i].ev)
		}
	}
	if _, ok := evs[51].ev.(*trainerproto.Eval); !ok {
		t.Fatalf("event 51 = %#v", evs[51].ev)
	}
	if _, ok := evs[52].ev.(*trainerproto.RunEnd); !ok {
		t.Fatalf("event 52 = %#v", evs[52].ev)
	}
	p := evs[0].peer
	for _, e := range evs {
		if e.peer != p {
			t.Fatalf("peer changed: %+v vs %+v", e.peer, p)
		}
	}
	want := Peer{ConnID: 1, PID: int32(os.Getpid()), UID: int32(os.Getuid()), GID: int32(os.Getgid())}
	if p != want {
		t.Fatalf("peer = %+v, want %+v", p, want)
	}

	c.c.Close()
	testkit.Eventually(t, "Disconnected", func() bool { return rec.numDisconnected() == 1 })
	time.Sleep(20 * time.Millisecond)
	rec.mu.Lock()
	if rec.disc[p.ConnID] != 1 {
		t.Errorf("Disconnected called %d times", rec.disc[p.ConnID])
	}
	rec.mu.Unlock()
	st := s.Stats()
	if st.Events != 53 || st.Lines != 53 || st.ConnsAccepted != 1 || st.ConnsActive != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func errLine(msg string, line int) string { return string(trainerproto.ErrorLine(msg, line)) }

func TestBadLinesGetErrorLines(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)
	c.send(
		`not json`,                     // 1
		``,                             // 2 blank: ignored but counted as a line
		`   `,                          // 3 blank
		`{"event":"foo","run_id":"r"}`, // 4
		`{"event":"step","run_id":"r","tokens":NaN}`,             // 5
		`{"event":"step","run_id":"r","tokens":-5}`,              // 6
		`{"event":"step","run_id":"r","tokens":1.5}`,             // 7
		"{\"event\":\"step\",\"run_id\":\"r\xff\",\"tokens\":1}", // 8
		`{"event":"step","run_id":"r","tokens":7}`,               // 9 valid
		`{"event":"run_end","run_id":"reject-me"}`,               // 10 handler error
		`{"event":"step","tokens":1}`,                            // 11
		`{"run_id":"r"}`,                                         // 12
		`{"event":"step","run_id":"r","tokens":8}`+"\r",          // 13 valid, CRLF
	)
	want := []string{
		errLine("invalid JSON: expected an object", 1),
		errLine(`unknown event "foo"`, 4),
		"", // line 5: invalid JSON, message from encoding/json
		errLine("step: tokens must be a non-negative integer", 6),
		errLine("step: tokens must be a non-negative integer", 7),
		errLine("invalid UTF-8", 8),
		errLine("run reject-me: rejected by handler", 10),
		errLine("missing run_id", 11),
		errLine(`missing "event"`, 12),
	}
	for i, w := range want {
		got := c.readLine()
		if w == "" {
			var m struct {
				Event, Error string
				Line         int
			}
			if err := json.Unmarshal([]byte(got), &m); err != nil || m.Event != "error" ||
				!strings.HasPrefix(m.Error, "invalid JSON: ") || m.Line != 5 {
				t.Errorf("reply %d = %q, want an invalid JSON error for line 5", i, got)
			}
			continue
		}
		if got != w {
			t.Errorf("reply %d = %q, want %q", i, got, w)
		}
	}
	testkit.Eventually(t, "3 events", func() bool { return rec.numEvents() == 3 })
	evs := rec.snapshot()
	if evs[0].ev.(*trainerproto.Step).Tokens != 7 || evs[1].ev.RunID() != "reject-me" || evs[2].ev.(*trainerproto.Step).Tokens != 8 {
		t.Fatalf("events = %v", evs)
	}
	st := s.Stats()
	wantPE := map[string]uint64{"invalid_json": 2, "unknown_event": 1, "invalid_field": 2, "invalid_utf8": 1, "invalid_run_id": 1, "missing_event": 1}
	if fmt.Sprint(st.ParseErrors) != fmt.Sprint(wantPE) || st.HandlerErrors != 1 || st.Lines != 11 || st.Events != 3 {
		t.Errorf("stats = %+v", st)
	}
}

func TestTenMegabyteLine(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)

	const size = 10 << 20
	big := bytes.Repeat([]byte("x"), size+1)
	big[size] = '\n'
	valid := []byte(`{"event":"step","run_id":"r","tokens":1}` + "\n")

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	writeErr := make(chan error, 1)
	go func() {
		_, err := c.c.Write(big)
		if err == nil {
			_, err = c.c.Write(valid)
		}
		writeErr <- err
	}()
	if got, want := c.readLine(), errLine("line too long: 10485760 bytes > 1048576", 1); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the valid line after the long one", func() bool { return rec.numEvents() == 1 })
	runtime.ReadMemStats(&after)
	t.Logf("allocated %d bytes while reading", after.TotalAlloc-before.TotalAlloc)
	if d := after.TotalAlloc - before.TotalAlloc; d > 4<<20 {
		t.Errorf("reading a 10 MB line allocated %d bytes", d)
	}
	if ev := rec.snapshot()[0]; ev.ev.(*trainerproto.Step).Tokens != 1 {
		t.Fatalf("event = %#v", ev.ev)
	}
	// And the connection still answers with the right line numbers.
	c.send(`{"event":"nope","run_id":"r"}`)
	if got, want := c.readLine(), errLine(`unknown event "nope"`, 3); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if st := s.Stats(); st.TooLong != 1 || st.Lines != 3 {
		t.Errorf("stats = %+v", st)
	}
}

func TestLineLimitBoundary(t *testing.T) {
	rec := newRecorder()
	const max = 100
	s := start(t, Config{MaxLineBytes: max}, rec)
	c := dial(t, s.cfg.Path)
	base := `{"event":"step","run_id":"r","tokens":1}`
	exact := base + strings.Repeat(" ", max-len(base))
	over := exact + " "
	// Longer than the bufio buffer and the limit, split over many reads.
	huge := `{"event":"step","run_id":"r","tokens":2,"x":"` + strings.Repeat("y", 3*readBufSize) + `"}`
	c.send(exact, over, huge, base)
	if got, want := c.readLine(), errLine("line too long: 101 bytes > 100", 2); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if got, want := c.readLine(), errLine(fmt.Sprintf("line too long: %d bytes > 100", len(huge)), 3); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	testkit.Eventually(t, "2 events", func() bool { return rec.numEvents() == 2 })
}

func TestLinesLongerThanReadBuffer(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)
	notes := strings.Repeat("n", 1000)
	var labels strings.Builder
	for i := 0; i < 60; i++ {
		fmt.Fprintf(&labels, `,"label%02d":"%s"`, i, strings.Repeat("v", 250))
	}
	line := `{"event":"run_start","run_id":"big","notes":"` + notes + `"` + labels.String() + `}`
	if len(line) <= readBufSize {
		t.Fatalf("test line too short: %d", len(line))
	}
	c.send(line, line)
	testkit.Eventually(t, "2 events", func() bool { return rec.numEvents() == 2 })
	for _, e := range rec.snapshot() {
		rs := e.ev.(*trainerproto.RunStart)
		if rs.Start.Metadata.Notes != notes || len(rs.Start.Labels) != 60 {
			t.Fatalf("run_start decoded wrongly: %d labels", len(rs.Start.Labels))
		}
	}
}

func TestConcurrentClients(t *testing.T) {
	rec := newRecorder()
	const clients, steps = 200, 100
	s := start(t, Config{MaxConnsPerUID: clients}, rec) // every client is this test's uid
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("unix", s.cfg.Path)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			w := bufio.NewWriter(c)
			for j := 1; j <= steps; j++ {
				fmt.Fprintf(w, `{"event":"step","run_id":"run-%d","step":%d,"tokens":1}`+"\n", i, j)
				if j%10 == 0 {
					if err := w.Flush(); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- w.Flush()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, "all clients disconnected", func() bool { return rec.numDisconnected() == clients })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.steps != clients*steps {
		t.Fatalf("handler saw %d steps, want %d", rec.steps, clients*steps)
	}
	if len(rec.perCon) != clients {
		t.Fatalf("%d connections seen", len(rec.perCon))
	}
	for id, seq := range rec.perCon {
		for j, v := range seq {
			if v != uint64(j+1) {
				t.Fatalf("conn %d: step %d at position %d", id, v, j)
			}
		}
		if rec.disc[id] != 1 {
			t.Fatalf("conn %d: Disconnected called %d times", id, rec.disc[id])
		}
	}
}

func TestClientThatNeverReads(t *testing.T) {
	rec := newRecorder()
	s, err := New(Config{Path: sockPath(t), WriteTimeout: 100 * time.Millisecond}, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	lazy := dial(t, s.cfg.Path)
	lazy.send(`{"event":"run_start","run_id":"lazy"}`)
	testkit.Eventually(t, "run_start", func() bool { return rec.numEvents() == 1 })
	lazyID := rec.snapshot()[0].peer.ConnID

	line := trainerproto.AdviceLine("lazy", &trainmeterv1.DataloaderAdvice{NumWorkers: 8, PrefetchFactor: 4, Reason: strings.Repeat("r", 1000), Classification: "data-bound", DataWaitShare: 0.4, GpuUtilization: 0.5, RamUsage: 0.3})
	ok, failed := 0, 0
	start := time.Now()
	for i := 0; i < 10000; i++ {
		if s.Send(lazyID, line) {
			ok++
		} else {
			failed++
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("10,000 Sends took %v", d)
	}
	if failed == 0 {
		t.Fatalf("Send never returned false (%d ok)", ok)
	}
	t.Logf("Send: %d queued, %d dropped", ok, failed)

	// Another client is unaffected, both ways.
	other := dial(t, s.cfg.Path)
	other.send(`{"event":"run_start","run_id":"busy"}`)
	testkit.Eventually(t, "second run_start", func() bool { return rec.numEvents() == 2 })
	otherID := rec.snapshot()[1].peer.ConnID
	stop := trainerproto.StopLine("busy", "budget exceeded")
	if !s.Send(otherID, stop) {
		t.Fatal("Send to a reading client failed")
	}
	if got := other.readLine(); got != string(stop) {
		t.Fatalf("got %q", got)
	}
	// The lazy client's events still get through.
	lazy.send(`{"event":"step","run_id":"lazy","tokens":5}`)
	testkit.Eventually(t, "lazy step", func() bool { return rec.numEvents() == 3 })

	st := s.Stats()
	if st.Dropped < uint64(failed) || st.Sent == 0 {
		t.Errorf("stats = %+v", st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("Shutdown took %v", d)
	}
	goleak.VerifyNone(t)
	if rec.numDisconnected() != 2 {
		t.Errorf("Disconnected for %d conns, want 2", rec.numDisconnected())
	}
}

func TestSocketModeAndGroup(t *testing.T) {
	s := start(t, Config{}, newRecorder())
	fi, err := os.Stat(s.cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Fatalf("mode = %v, want socket 0660", fi.Mode())
	}

	g, err := user.LookupGroupId(strconv.Itoa(os.Getgid()))
	if err != nil {
		t.Skipf("no name for gid %d: %v", os.Getgid(), err)
	}
	s2 := start(t, Config{Mode: 0o600, Group: g.Name}, newRecorder())
	fi, err = os.Stat(s2.cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || int(fi.Sys().(*syscall.Stat_t).Gid) != os.Getgid() {
		t.Fatalf("mode %v gid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid)
	}

	s3, err := New(Config{Path: sockPath(t), Group: "no-such-group-trainmeter-test"}, newRecorder(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "no-such-group") {
		t.Fatalf("Start with unknown group: %v", err)
	}
	if _, err := os.Lstat(s3.cfg.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left behind: %v", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	path := sockPath(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // the "dead agent": its socket file stays
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	s := start(t, Config{Path: path}, rec)
	c := dial(t, path)
	c.send(`{"event":"run_end","run_id":"r"}`)
	testkit.Eventually(t, "event", func() bool { return rec.numEvents() == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file not removed: %v", err)
	}
}

func TestRefusesLiveSocket(t *testing.T) {
	first := start(t, Config{}, newRecorder())
	s, err := New(Config{Path: first.cfg.Path}, newRecorder(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "another agent is listening") {
		t.Fatalf("second Start: %v", err)
	}
	// The first server is untouched.
	rec := first.h.(*recorder)
	c := dial(t, first.cfg.Path)
	c.send(`{"event":"run_end","run_id":"r"}`)
	testkit.Eventually(t, "event", func() bool { return rec.numEvents() == 1 })
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(first.cfg.Path); err != nil {
		t.Fatalf("failed server removed the live socket: %v", err)
	}
}

func TestRefusesNonSocket(t *testing.T) {
	path := sockPath(t)
	if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Path: path}, newRecorder(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Start: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "precious" {
		t.Fatal("file was touched")
	}
}

func TestMaxConns(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{MaxConns: 2}, rec)
	a, b := dial(t, s.cfg.Path), dial(t, s.cfg.Path)
	a.send(`{"event":"run_end","run_id":"a"}`)
	b.send(`{"event":"run_end","run_id":"b"}`)
	testkit.Eventually(t, "2 events", func() bool { return rec.numEvents() == 2 })
	c := dial(t, s.cfg.Path)
	if got, want := c.readLine(), errLine("too many connections (limit 2)", 0); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	c.expectEOF()
	a.c.Close()
	testkit.Eventually(t, "a disconnected", func() bool { return rec.numDisconnected() == 1 })
	d := dial(t, s.cfg.Path)
	d.send(`{"event":"run_end","run_id":"d"}`)
	testkit.Eventually(t, "d's event", func() bool { return rec.numEvents() == 3 })
	if st := s.Stats(); st.ConnsRejected != 1 || st.ConnsAccepted != 3 || st.ConnsActive != 2 {
		t.Errorf("stats = %+v", st)
	}
}

func TestSendUnknownOrClosed(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	if s.Send(12345, trainerproto.StopLine("r", "x")) {
		t.Fatal("Send to unknown conn succeeded")
	}
	c := dial(t, s.cfg.Path)
	c.send(`{"event":"run_start","run_id":"r"}`)
	testkit.Eventually(t, "event", func() bool { return rec.numEvents() == 1 })
	id := rec.snapshot()[0].peer.ConnID
	// A line without its newline gets one.
	if !s.Send(id, []byte(`{"event":"stop","run_id":"r"}`)) {
		t.Fatal("Send failed")
	}
	if got := c.readLine(); got != `{"event":"stop","run_id":"r"}`+"\n" {
		t.Fatalf("got %q", got)
	}
	c.c.Close()
	testkit.Eventually(t, "disconnect", func() bool { return rec.numDisconnected() == 1 })
	if s.Send(id, trainerproto.StopLine("r", "x")) {
		t.Fatal("Send to closed conn succeeded")
	}
}

func TestHalfCloseStillGetsReplies(t *testing.T) {
	rec := newRecorder()
	s := start(t, Config{}, rec)
	c := dial(t, s.cfg.Path)
	c.send(`{"event":"run_end","run_id":"ok"}`, `garbage`)
	// A final line without a newline is still processed at EOF.
	if _, err := c.c.Write([]byte(`{"event":"run_end","run_id":"last"}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.readLine(), errLine("invalid JSON: expected an object", 2); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	c.expectEOF()
	testkit.Eventually(t, "disconnect", func() bool { return rec.numDisconnected() == 1 })
	evs := rec.snapshot()
	if len(evs) != 2 || evs[0].ev.RunID() != "ok" || evs[1].ev.RunID() != "last" {
		t.Fatalf("events = %v", evs)
	}
}

func TestShutdownClosesEverything(t *testing.T) {
	rec := newRecorder()
	s, err := New(Config{Path: sockPath(t)}, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(context.Background()); err != nil { // before Start: no-op
		t.Fatal(err)
	}
	s, _ = New(Config{Path: sockPath(t)}, rec, nil)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	var clients []*client
	for i := 0; i < 10; i++ {
		c := dial(t, s.cfg.Path)
		c.send(fmt.Sprintf(`{"event":"run_start","run_id":"r%d"}`, i))
		clients = append(clients, c)
	}
	testkit.Eventually(t, "10 events", func() bool { return rec.numEvents() == 10 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t)
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	for _, c := range clients {
		c.expectEOF()
	}
	rec.mu.Lock()
	if len(rec.disc) != 10 {
		t.Errorf("Disconnected for %d conns", len(rec.disc))
	}
	for id, n := range rec.disc {
		if n != 1 {
			t.Errorf("conn %d: Disconnected %d times", id, n)
		}
	}
	rec.mu.Unlock()
	if _, err := os.Lstat(s.cfg.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file still there: %v", err)
	}
	if _, err := net.Dial("unix", s.cfg.Path); err == nil {
		t.Fatal("dial after Shutdown succeeded")
	}
	if err := s.Start(context.Background()); err == nil {
		t.Fatal("Start after Shutdown succeeded")
	}
}

func TestShutdownKeepsSomeoneElsesSocket(t *testing.T) {
	s := start(t, Config{}, newRecorder())
	// Someone replaced our socket file (e.g. a new agent after ours was
	// presumed dead): Shutdown must not delete theirs.
	if err := os.Remove(s.cfg.Path); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", s.cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(s.cfg.Path); err != nil {
		t.Fatalf("other socket removed: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}, newRecorder(), nil); err == nil {
		t.Error("empty path accepted")
	}
	if _, err := New(Config{Path: "x"}, nil, nil); err == nil {
		t.Error("nil handler accepted")
	}
	if _, err := New(Config{Path: "x", Mode: os.ModeDir | 0o660}, newRecorder(), nil); err == nil {
		t.Error("non-permission mode accepted")
	}
	s, err := New(Config{Path: "x"}, newRecorder(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Mode != 0o660 || s.cfg.MaxLineBytes != 1<<20 || s.cfg.MaxConns != 4096 || s.cfg.WriteQueue != 64 || s.cfg.WriteTimeout != 5*time.Second {
		t.Errorf("defaults = %+v", s.cfg)
	}
}
