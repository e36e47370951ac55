// Package trainersock is the agent's local Unix socket server for trainer
// processes: newline-delimited JSON events in (parsed by trainerproto), error,
// advice and stop lines out.
//
// Each connection has a reader goroutine, which parses lines and calls the
// Handler in order, and a writer goroutine, which drains a bounded queue of
// outbound lines with write deadlines. Nothing a client does (garbage, huge
// lines, never reading its socket, vanishing) blocks the agent or other
// clients: oversized lines are skipped without being buffered whole, bad lines
// get an error line back and the connection stays open, and outbound lines
// that do not fit in a client's queue are dropped and counted.
package trainersock

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Defaults for Config's zero values.
const (
	DefaultMode           os.FileMode = 0o660
	DefaultMaxLineBytes               = 1 << 20
	DefaultMaxConns                   = 4096
	DefaultWriteQueue                 = 64
	DefaultWriteTimeout               = 5 * time.Second
	DefaultMaxConnsPerUID             = 64
	DefaultIdleTimeout                = 30 * time.Second
)

// Reasons a connection is refused, the keys of Stats.Rejected.
const (
	RejectMaxConns      = "max_conns"       // MaxConns connections were open
	RejectUIDConns      = "uid_conns"       // MaxConnsPerUID connections of its uid were open
	RejectUIDNotAllowed = "uid_not_allowed" // its uid is not in AllowedUIDs
	RejectNoPeerCred    = "no_peer_cred"    // SO_PEERCRED could not be read: the uid is unknown
)

const (
	readBufSize   = 8 << 10  // per-connection bufio size; longer lines are assembled
	keepLineBuf   = 64 << 10 // larger line buffers are released after use
	drainTimeout  = time.Second
	staleDialWait = time.Second
)

// Peer identifies one connection: a server-assigned id (unique for the
// Server's lifetime, starting at 1) and the connecting process's credentials
// from SO_PEERCRED at accept (-1 where they could not be read).
type Peer struct {
	ConnID        uint64
	PID, UID, GID int32
}

// Handler receives events. Both methods are called from the connection's
// reader goroutine, so calls for one connection never overlap, but calls for
// different connections do: the handler does its own locking. A Handler may
// call Server.Send, but must not call Server.Shutdown.
type Handler interface {
	// Handle is called for each valid event, in order per connection; a
	// non-nil error is written back to that client as an error line (and
	// nothing else happens).
	Handle(p Peer, ev trainerproto.Event) error
	// Disconnected is called once when a connection closes (the agent uses
	// it to end that rank's runs), after its last Handle call.
	Disconnected(p Peer)
}

// Config configures a Server. Zero values take the defaults.
type Config struct {
	Path  string      // socket path, required
	Mode  os.FileMode // permission bits of the socket file; default 0660
	Group string      // optional group name to chown the socket file to
	// MaxLineBytes caps one inbound line (without its newline); longer lines
	// are answered with an error line and skipped.
	MaxLineBytes int
	MaxConns     int // concurrent connections; more are refused
	WriteQueue   int // outbound lines queued per connection
	// WriteTimeout is the deadline of each write to a client; a client that
	// does not read for this long is stalled (its queue fills, lines drop).
	WriteTimeout time.Duration
	// AllowedUIDs, when not empty, are the peer uids (SO_PEERCRED) allowed
	// to connect; others get one error line. Empty: the file mode decides.
	AllowedUIDs []uint32
	// MaxConnsPerUID caps one uid's open connections, so a tenant that
	// opens many uses up only its own share (a node's trainers are a
	// process per GPU, plus tools).
	MaxConnsPerUID int
	// IdleTimeout closes a connection with no run_start accepted this long
	// after it connected, freeing its uid's share; a connection with a
	// started run is never timed out. Negative: off.
	IdleTimeout time.Duration
	Clock       clock.Clock // times IdleTimeout; the wall clock if nil
}

// Stats are the server's counters since Start; the agent's GET /status
// serves them under "socket" with these JSON names.
type Stats struct {
	ConnsActive   int    `json:"conns_active"`   // connections open now
	ConnsAccepted uint64 `json:"conns_accepted"` // connections accepted
	ConnsRejected uint64 `json:"conns_rejected"` // connections refused, for any reason in Rejected
	// Rejected counts refused connections by reason (RejectMaxConns,
	// RejectUIDConns, RejectUIDNotAllowed, RejectNoPeerCred); they sum to
	// ConnsRejected.
	Rejected   map[string]uint64 `json:"conns_rejected_by"`
	IdleClosed uint64            `json:"conns_idle_closed"` // connections closed by IdleTimeout
	Lines      uint64            `json:"lines"`             // non-blank inbound lines, valid or not (too long included)
	Events     uint64            `json:"events"`            // valid events passed to the Handler
	// ParseErrors counts invalid lines by trainerproto.ErrKind
	// ("invalid_json", "invalid_utf8", "missing_event", "unknown_event",
	// "invalid_run_id", "invalid_field").
	ParseErrors   map[string]uint64 `json:"parse_errors"`
	HandlerErrors uint64            `json:"handler_errors"`  // Handle calls that returned an error
	TooLong       uint64            `json:"too_long"`        // lines longer than MaxLineBytes
	Sent          uint64            `json:"replies_sent"`    // outbound lines written
	Dropped       uint64            `json:"replies_dropped"` // outbound lines dropped: queue full or client gone
	WriteStalls   uint64            `json:"write_stalls"`    // writes that hit WriteTimeout
}

const (
	stateNew = iota
	stateStarted
	stateClosed
)

// Server serves the trainer protocol on a Unix socket.
type Server struct {
	cfg Config
	h   Handler
	log *slog.Logger

	mu       sync.RWMutex
	state    int
	ln       *net.UnixListener
	sockInfo os.FileInfo // the socket file we created, to remove only ours
	conns    map[uint64]*conn
	perUID   map[int32]int // open connections per peer uid
	quit     chan struct{}

	nextID atomic.Uint64
	wg     sync.WaitGroup

	accepted, rejected, lines, events, handlerErrs, tooLong,
	sent, dropped, stalls, idleClosed atomic.Uint64
	countMu     sync.Mutex // guards parseErrors and rejectedBy
	parseErrors map[string]uint64
	rejectedBy  map[string]uint64
}

type conn struct {
	peer       Peer
	nc         *net.UnixConn
	out        chan []byte
	done       chan struct{} // closed by the reader when it stops reading
	writerDone chan struct{} // closed by the writer when it exits
	started    chan struct{} // closed when a run_start is accepted
	startOnce  sync.Once
}

// New checks cfg and returns a Server; nothing is opened until Start. A nil
// logger discards.
func New(cfg Config, h Handler, logger *slog.Logger) (*Server, error) {
	if cfg.Path == "" {
		return nil, errors.New("trainersock: Config.Path is required")
	}
	if h == nil {
		return nil, errors.New("trainersock: Handler is required")
	}
	if cfg.Mode&^os.ModePerm != 0 {
		return nil, fmt.Errorf("trainersock: Config.Mode %v has bits other than permissions", cfg.Mode)
	}
	cfg.Mode = cmp.Or(cfg.Mode, DefaultMode)
	orDefault(&cfg.MaxLineBytes, DefaultMaxLineBytes)
	orDefault(&cfg.MaxConns, DefaultMaxConns)
	orDefault(&cfg.WriteQueue, DefaultWriteQueue)
	orDefault(&cfg.WriteTimeout, DefaultWriteTimeout)
	orDefault(&cfg.MaxConnsPerUID, DefaultMaxConnsPerUID)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout) // negative: off
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	return &Server{
		cfg:         cfg,
		h:           h,
		log:         logger.With("component", "trainersock"),
		conns:       make(map[uint64]*conn),
		perUID:      make(map[int32]int),
		quit:        make(chan struct{}),
		parseErrors: make(map[string]uint64),
		rejectedBy:  make(map[string]uint64),
	}, nil
}

// orDefault sets *v to def when it is not positive.
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Start listens on cfg.Path and serves in background goroutines. A socket
// file left behind by a dead agent is replaced; if another process accepts
// connections on it, or the path is not a socket, Start refuses. The socket
// file gets cfg.Mode and, when set, cfg.Group. Start may be called once;
// ctx bounds only the start (the lifecycle of internal/lifecycle).
func (s *Server) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateNew {
		return errors.New("trainersock: Start called twice or after Shutdown")
	}
	path := s.cfg.Path
	gid := -1
	if s.cfg.Group != "" {
		g, err := user.LookupGroup(s.cfg.Group)
		if err != nil {
			return fmt.Errorf("trainersock: group %q: %w", s.cfg.Group, err)
		}
		if gid, err = strconv.Atoi(g.Gid); err != nil {
			return fmt.Errorf("trainersock: group %q has non-numeric gid %q", s.cfg.Group, g.Gid)
		}
	}
	if err := s.removeStale(path); err != nil {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("trainersock: listen: %w", err)
	}
	ln.SetUnlinkOnClose(false) // Shutdown removes the file, and only if it is still ours
	fail := func(err error) error {
		ln.Close()
		os.Remove(path)
		return err
	}
	if err := os.Chmod(path, s.cfg.Mode); err != nil {
		return fail(fmt.Errorf("trainersock: chmod: %w", err))
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			return fail(fmt.Errorf("trainersock: chgrp %s: %w", s.cfg.Group, err))
		}
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("trainersock: %w", err))
	}
	s.ln, s.sockInfo, s.state = ln, fi, stateStarted
	s.wg.Add(1)
	go s.acceptLoop(ln)
	s.log.Info("listening", "path", path, "mode", s.cfg.Mode, "group", s.cfg.Group)
	return nil
}

// removeStale removes a socket file at path that nobody accepts on.
func (s *Server) removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trainersock: %w", err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("trainersock: %s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, staleDialWait)
	if err == nil {
		c.Close()
		return fmt.Errorf("trainersock: another agent is listening on %s", path)
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("trainersock: removing stale socket: %w", err)
		}
		s.log.Info("removed stale socket", "path", path)
		return nil
	case errors.Is(err, syscall.ENOENT):
		return nil
	default:
		return fmt.Errorf("trainersock: cannot tell whether %s is in use: %w", path, err)
	}
}

func (s *Server) acceptLoop(ln *net.UnixListener) {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: back off, as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.quit:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		s.serve(nc)
	}
}

func (s *Server) serve(nc *net.UnixConn) {
	p := Peer{ConnID: s.nextID.Add(1)}
	var err error
	if p.PID, p.UID, p.GID, err = readPeerCred(nc); err != nil {
		// Without the peer's uid neither the allow-list, the per-uid cap
		// nor the runs' ownership can be applied: refuse.
		s.log.Warn("SO_PEERCRED failed", "conn", p.ConnID, "err", err)
		s.refuse(nc, p, RejectNoPeerCred, "the agent cannot tell who connected (SO_PEERCRED failed): refused")
		return
	}
	if !s.uidAllowed(p.UID) {
		s.refuse(nc, p, RejectUIDNotAllowed, fmt.Sprintf("uid %d is not allowed to report to this agent", p.UID))
		return
	}
	s.mu.Lock()
	var reason, msg string
	switch {
	case s.state != stateStarted:
		s.mu.Unlock()
		nc.Close()
		return
	case len(s.conns) >= s.cfg.MaxConns:
		reason, msg = RejectMaxConns, fmt.Sprintf("too many connections (limit %d)", s.cfg.MaxConns)
	case s.perUID[p.UID] >= s.cfg.MaxConnsPerUID:
		reason, msg = RejectUIDConns, fmt.Sprintf("too many connections from uid %d (limit %d)", p.UID, s.cfg.MaxConnsPerUID)
	}
	if reason != "" {
		s.mu.Unlock()
		s.refuse(nc, p, reason, msg)
		return
	}
	c := &conn{peer: p, nc: nc, out: make(chan []byte, s.cfg.WriteQueue),
		done: make(chan struct{}), writerDone: make(chan struct{}), started: make(chan struct{})}
	s.conns[p.ConnID] = c
	s.perUID[p.UID]++
	s.wg.Add(2)
	if s.cfg.IdleTimeout > 0 {
		s.wg.Add(1)
		go s.watchIdle(c, s.cfg.Clock.After(s.cfg.IdleTimeout))
	}
	s.mu.Unlock()
	s.accepted.Add(1)
	s.log.Debug("trainer connected", "conn", p.ConnID, "pid", p.PID, "uid", p.UID, "gid", p.GID)
	go s.writeLoop(c)
	go s.readLoop(c)
}

// watchIdle ends c when idle fires before a run_start is accepted: it
// queues an error line and shuts the socket's reading side, so the reader
// drains what is buffered, sees EOF and tears the connection down as for a
// client that hung up (the writer flushes the line first).
func (s *Server) watchIdle(c *conn, idle <-chan time.Time) {
	defer s.wg.Done()
	select {
	case <-idle:
	case <-c.started:
		return
	case <-c.done:
		return
	}
	s.idleClosed.Add(1)
	s.log.Info("closing a trainer connection that sent no run_start", "conn", c.peer.ConnID, "uid", c.peer.UID, "pid", c.peer.PID, "after", s.cfg.IdleTimeout)
	s.reply(c, trainerproto.ErrorLine(fmt.Sprintf("no run_start within %s: closing", s.cfg.IdleTimeout), 0))
	_ = c.nc.CloseRead()
}

// refuse answers one error line (msg) and closes nc, counting and logging
// why.
func (s *Server) refuse(nc *net.UnixConn, p Peer, reason, msg string) {
	s.log.Warn("refusing a trainer connection", "why", msg, "conn", p.ConnID, "pid", p.PID, "uid", p.UID)
	s.rejected.Add(1)
	s.countMu.Lock()
	s.rejectedBy[reason]++
	s.countMu.Unlock()
	nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	nc.Write(trainerproto.ErrorLine(msg, 0))
	nc.Close()
}

// uidAllowed checks uid against AllowedUIDs (empty: any).
func (s *Server) uidAllowed(uid int32) bool {
	return len(s.cfg.AllowedUIDs) == 0 || uid >= 0 && slices.Contains(s.cfg.AllowedUIDs, uint32(uid))
}

// readLoop reads lines with a hard cap: a line longer than MaxLineBytes is
// counted and skipped up to its newline without being kept.
func (s *Server) readLoop(c *conn) {
	defer s.wg.Done()
	limit := s.cfg.MaxLineBytes
	br := bufio.NewReaderSize(newSocketReader(c.nc), readBufSize)
	var (
		lineNo  int
		buf     []byte // assembles lines longer than the bufio buffer
		n       int    // bytes of the current line so far, newline excluded
		tooLong bool
	)
	finish := func(frag []byte) {
		lineNo++
		line := frag
		if len(buf) > 0 {
			line = buf
		}
		s.handleLine(c, lineNo, line, tooLong, n)
		n, tooLong = 0, false
		if cap(buf) > keepLineBuf {
			buf = nil
		} else {
			buf = buf[:0]
		}
	}
	for {
		frag, err := br.ReadSlice('\n')
		complete := err == nil
		if complete {
			frag = frag[:len(frag)-1]
		}
		n += len(frag)
		if !tooLong {
			switch {
			case n > limit:
				tooLong, buf = true, nil
			case !complete || len(buf) > 0:
				buf = appendCapped(buf, frag, limit)
			}
		}
		if complete {
			finish(frag)
			continue
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && n > 0 { // last line without a newline
			finish(nil)
		}
		if err != io.EOF && !errors.Is(err, net.ErrClosed) {
			s.log.Debug("read failed", "conn", c.peer.ConnID, "err", err)
		}
		break
	}
	s.teardown(c)
}

// appendCapped appends frag to buf, growing by doubling but never beyond
// limit bytes of capacity (the caller guarantees len(buf)+len(frag) ≤ limit),
// so that assembling a line near the limit costs about twice the limit.
func appendCapped(buf, frag []byte, limit int) []byte {
	if need := len(buf) + len(frag); need > cap(buf) {
		c := max(2*cap(buf), need, readBufSize)
		c = min(c, max(limit, need))
		nb := make([]byte, len(buf), c)
		copy(nb, buf)
		buf = nb
	}
	return append(buf, frag...)
}

func (s *Server) handleLine(c *conn, lineNo int, line []byte, tooLong bool, n int) {
	if tooLong {
		s.lines.Add(1)
		s.tooLong.Add(1)
		s.reply(c, trainerproto.ErrorLine(fmt.Sprintf("line too long: %d bytes > %d", n, s.cfg.MaxLineBytes), lineNo))
		return
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	s.lines.Add(1)
	ev, err := trainerproto.Parse(line)
	if err != nil {
		kind := "other"
		var pe *trainerproto.Error
		if errors.As(err, &pe) {
			kind = string(pe.Kind)
		}
		s.countMu.Lock()
		s.parseErrors[kind]++
		s.countMu.Unlock()
		s.reply(c, trainerproto.ErrorLine(err.Error(), lineNo))
		return
	}
	s.events.Add(1)
	if err := s.h.Handle(c.peer, ev); err != nil {
		s.handlerErrs.Add(1)
		s.reply(c, trainerproto.ErrorLine(err.Error(), lineNo))
		return
	}
	if _, ok := ev.(*trainerproto.RunStart); ok {
		c.startOnce.Do(func() { close(c.started) })
	}
}

// reply queues a line for c's writer without waiting; a full queue drops
// (and counts) it.
func (s *Server) reply(c *conn, line []byte) bool {
	select {
	case c.out <- line:
		return true
	default:
		s.dropped.Add(1)
		return false
	}
}

// teardown runs once, on the reader goroutine, when reading stops.
func (s *Server) teardown(c *conn) {
	s.mu.Lock()
	delete(s.conns, c.peer.ConnID) // no Send can queue after this
	if s.perUID[c.peer.UID]--; s.perUID[c.peer.UID] <= 0 {
		delete(s.perUID, c.peer.UID)
	}
	s.mu.Unlock()
	close(c.done)
	// Let the writer flush what is queued (e.g. the error for the last line
	// of a client that half-closed), but not for long.
	t := time.NewTimer(drainTimeout)
	select {
	case <-c.writerDone:
	case <-t.C:
	case <-s.quit:
	}
	t.Stop()
	c.nc.Close()
	<-c.writerDone
	s.log.Debug("trainer disconnected", "conn", c.peer.ConnID, "pid", c.peer.PID)
	s.h.Disconnected(c.peer)
}

// writeLoop writes queued lines until the reader stops and the queue is
// empty. After a failed write it drops (and counts) the lines instead.
func (s *Server) writeLoop(c *conn) {
	defer s.wg.Done()
	defer close(c.writerDone)
	failed := false
	for {
		var b []byte
		select {
		case b = <-c.out:
		case <-c.done:
			select {
			case b = <-c.out:
			default:
				return
			}
		}
		if failed = failed || !s.write(c, b); failed {
			s.dropped.Add(1)
		}
	}
}

// write writes one whole line. A write that times out is resumed where it
// stopped (so the client never sees a torn line) until the reader is done.
func (s *Server) write(c *conn, b []byte) bool {
	stalled := false
	for len(b) > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		n, err := c.nc.Write(b)
		b = b[n:]
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			s.stalls.Add(1)
			if !stalled {
				stalled = true
				s.log.Debug("trainer is not reading its socket", "conn", c.peer.ConnID, "pid", c.peer.PID)
			}
			select {
			case <-c.done:
				return false
			default:
				continue
			}
		}
		return false
	}
	s.sent.Add(1)
	return true
}

// Send queues line (one newline-terminated line, e.g. from
// trainerproto.AdviceLine or StopLine) for the client on connID. It never
// blocks: it returns false, and counts the line as dropped, when the
// connection is unknown or closed or its queue is full. line must not be
// modified afterwards.
func (s *Server) Send(connID uint64, line []byte) bool {
	if len(line) == 0 {
		return false
	}
	if line[len(line)-1] != '\n' {
		line = append(line[:len(line):len(line)], '\n')
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	c := s.conns[connID]
	if c == nil {
		s.dropped.Add(1)
		return false
	}
	return s.reply(c, line)
}

// Shutdown stops accepting, removes the socket file (if it is still the one
// Start created), closes all connections (each gets its Disconnected call)
// and waits for every goroutine to finish or ctx to end. It may be called
// more than once, and before Start.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	first := s.state == stateStarted
	s.state = stateClosed
	var conns []*conn
	if first {
		close(s.quit)
		s.ln.Close()
		if fi, err := os.Lstat(s.cfg.Path); err == nil && os.SameFile(fi, s.sockInfo) {
			if err := os.Remove(s.cfg.Path); err != nil {
				s.log.Warn("removing socket file", "err", err)
			}
		}
		conns = slices.Collect(maps.Values(s.conns))
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.nc.Close() // the reader sees the error and tears the connection down
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	return lifecycle.Wait(ctx, done, "trainersock")
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.RLock()
	active := len(s.conns)
	s.mu.RUnlock()
	s.countMu.Lock()
	pe, rej := maps.Clone(s.parseErrors), maps.Clone(s.rejectedBy)
	s.countMu.Unlock()
	return Stats{
		ConnsActive:   active,
		ConnsAccepted: s.accepted.Load(),
		ConnsRejected: s.rejected.Load(),
		Lines:         s.lines.Load(),
		Events:        s.events.Load(),
		ParseErrors:   pe,
		HandlerErrors: s.handlerErrs.Load(),
		TooLong:       s.tooLong.Load(),
		Sent:          s.sent.Load(),
		Dropped:       s.dropped.Load(),
		WriteStalls:   s.stalls.Load(),
		Rejected:      rej,
		IdleClosed:    s.idleClosed.Load(),
	}
}

var _ lifecycle.Component = (*Server)(nil)

// readPeerCred reads a connection's credentials; tests replace it to
// make the read fail.
var readPeerCred = PeerCred
