package cli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// runStatus shows a running command's figures from the collector's GetRun:
// on a terminal, one line redrawn every second on the bottom row, which a
// scroll region over the rows above keeps to itself (the command writes
// straight to the terminal, and its output scrolls above, never onto that
// row); else a plain line every --status-every; and the run's report at
// the end.
type runStatus struct {
	o       *runOptions
	started time.Time
	active  bool // the run reached the agent
	// endSent is when run_end went to the agent: the report waits for an
	// end at or after it, not the end of the part before a --resume.
	endSent time.Time

	q     trainmeterv1.QueryServiceClient
	close func()
	err   error // dialling the collector failed

	mu     sync.Mutex
	warned bool
	// rows is the terminal height the scroll region was set for (0: not
	// set): rows 1..rows−1 scroll, row rows holds the live line.
	rows      int
	lastE     float64 // energy_total_j and wall_s at the previous poll
	lastWall  float64
	lastPower float64
}

func newStatus(o *runOptions, active bool) *runStatus {
	s := &runStatus{o: o, started: time.Now(), active: active}
	if o.query != nil && active {
		s.q, s.close, s.err = o.query()
	}
	return s
}

// run starts the status loop; the returned func stops it and clears the
// terminal line.
func (s *runStatus) run() (stop func()) {
	if s.q == nil {
		if s.err != nil {
			s.warnOnce("cannot reach the collector (%v): no live status", s.err)
		}
		return func() {}
	}
	every := s.o.statusEvery
	if s.o.tty {
		every = s.o.tick
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			s.poll()
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		s.mu.Lock()
		if s.rows > 0 {
			// Clear the live line and give the whole screen back to
			// scrolling; the cursor stays where the command left it.
			fmt.Fprintf(s.o.stderr, "\0337\033[%d;1H\033[K\033[r\0338", s.rows)
			s.rows = 0
		}
		s.mu.Unlock()
	}
}

// drawLive draws line on the terminal's bottom row, first setting the
// scroll region above it (again after a resize). The cursor is saved and
// restored around each draw, so the command's output goes on where it was.
// Called with s.mu held.
func (s *runStatus) drawLive(line string) {
	rows, cols, ok := s.o.termSize()
	if !ok || rows < 2 || cols < 2 {
		return
	}
	switch {
	case s.rows == 0:
		// A new line first, so that the cursor, even on the bottom row, is
		// inside the region once it is set (setting it homes the cursor:
		// saved and restored around it, then moved back up into the region).
		fmt.Fprintf(s.o.stderr, "\n\0337\033[1;%dr\0338\033[1A", rows-1)
	case s.rows != rows:
		fmt.Fprintf(s.o.stderr, "\0337\033[1;%dr\0338", rows-1)
	}
	s.rows = rows
	if r := []rune(line); len(r) > cols-1 {
		line = string(r[:cols-1]) // a wrapped line would scroll the whole screen
	}
	fmt.Fprintf(s.o.stderr, "\0337\033[%d;1H\033[K%s\0338", rows, line)
}

func (s *runStatus) warnOnce(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.warned {
		return
	}
	s.warned = true
	fmt.Fprintf(s.o.stderr, "trainmeter: "+format+"\n", args...)
}

func (s *runStatus) get(timeout time.Duration) (*trainmeterv1.RunReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := s.q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: s.o.runID})
	if err != nil {
		return nil, err
	}
	return resp.GetRun(), nil
}

func (s *runStatus) poll() {
	r, err := s.get(2 * time.Second)
	if c := status.Code(err); s.o.collectors > 1 && (c == codes.Unavailable || c == codes.DeadlineExceeded) {
		// One of a pair went down: ask the first that answers now.
		if q, closeConn, derr := s.o.query(); derr == nil {
			s.close()
			s.q, s.close = q, closeConn
			r, err = s.get(2 * time.Second)
		}
	}
	if err != nil {
		if status.Code(err) != codes.NotFound { // NotFound: no batch of the run arrived yet
			s.warnOnce("cannot reach the collector for the live status (%v); the command keeps running", err)
		}
		r = nil
	}
	line := s.line(time.Since(s.started), r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.o.tty {
		s.drawLive(line)
	} else {
		fmt.Fprintln(s.o.stderr, line)
	}
}

// line formats one status line; r may be nil (nothing at the collector yet).
func (s *runStatus) line(elapsed time.Duration, r *trainmeterv1.RunReport) string {
	parts := []string{"trainmeter " + s.o.runID, fmtElapsed(elapsed)}
	if r == nil {
		return strings.Join(append(parts, "waiting for the collector"), " | ")
	}
	e, wall := r.GetEnergyTotalJ(), r.GetWallS()
	// Power over the last window: the energy the collector added since the
	// previous poll over the run time it covers.
	if wall > s.lastWall && s.lastWall > 0 {
		s.lastPower = (e - s.lastE) / (wall - s.lastWall)
	}
	if wall > s.lastWall {
		s.lastE, s.lastWall = e, wall
	}
	if s.lastPower > 0 {
		parts = append(parts, fmt.Sprintf("%.0f W", s.lastPower))
	} else {
		parts = append(parts, "- W")
	}
	parts = append(parts, fmt.Sprintf("%.1f kJ", e/1000))
	tok := r.GetTokensProcessed()
	parts = append(parts, fmt.Sprintf("%d tok", tok))
	if tok > 0 {
		parts = append(parts, fmt.Sprintf("%.4g J/tok", e/float64(tok)))
	}
	// The run's total cost (compute × priority + energy, docs/costs.md),
	// where the collector knows a price.
	if usd := r.GetTotalCostUsd(); r.TotalCostUsd != nil {
		shown := money.USDs(usd, r.GetProjectedCostUsd(), r.GetMaxCostUsd())
		s := shown[0]
		if !r.GetEnded() && r.GetProjectionBasis() != "" && r.GetProjectedCostUsd() > usd {
			s += " (→ " + shown[1] + ")"
		}
		if r.MaxCostUsd != nil {
			s += " of max " + shown[2]
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " | ")
}

func fmtElapsed(d time.Duration) string {
	d = d.Round(time.Second)
	h, m, sec := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	if h > 0 {
		return fmt.Sprintf("%d:%02d:%02d", h, m, sec)
	}
	return fmt.Sprintf("%d:%02d", m, sec)
}

// endClockSlack allows for the agent's end stamp, taken on the same host's
// clock after run_end was sent, reading a hair earlier (clock steps).
const endClockSlack = 100 * time.Millisecond

// final waits (bounded by --report-wait) for the collector to see the run
// end, then prints its report to stdout.
func (s *runStatus) final() {
	if s.q == nil {
		if s.err != nil {
			s.warnOnce("cannot reach the collector (%v): no report; `trainmeter report %s` shows it later", s.err, s.o.runID)
		}
		return
	}
	defer s.close()
	deadline := time.Now().Add(s.o.reportWait)
	var r *trainmeterv1.RunReport
	var err error
	for {
		r, err = s.get(2 * time.Second)
		if (err == nil && r.GetEnded() && !r.GetEnd().AsTime().Before(s.endSent.Add(-endClockSlack))) || (err != nil && status.Code(err) != codes.NotFound) || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		s.warnOnce("cannot get the run's report from the collector (%v); `trainmeter report %s` shows it later", err, s.o.runID)
		return
	}
	fmt.Fprintln(s.o.stdout)
	if !r.GetEnded() {
		fmt.Fprintf(s.o.stdout, "(the collector has not seen run %s end after %v; figures so far, `trainmeter report %s` later shows the final ones)\n",
			s.o.runID, s.o.reportWait, s.o.runID)
	}
	_ = report.WriteReport(s.o.stdout, r)
}
