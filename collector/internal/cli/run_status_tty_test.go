package cli

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// vt is a small terminal: the control sequences the live status and a
// command's plain output use (CR, LF as the tty's onlcr gives it, ESC 7/8,
// CSI r, H/f, A, K), on a rows × cols screen.
type vt struct {
	mu             sync.Mutex
	rows, cols     int
	screen         [][]rune
	r, c           int
	top, bot       int // scroll region, 0-based inclusive
	savedR, savedC int
}

func newVT(rows, cols int) *vt {
	v := &vt{rows: rows, cols: cols, top: 0, bot: rows - 1}
	for range rows {
		v.screen = append(v.screen, []rune(strings.Repeat(" ", cols)))
	}
	return v
}

func (v *vt) lineFeed() {
	switch {
	case v.r == v.bot:
		copy(v.screen[v.top:v.bot], v.screen[v.top+1:v.bot+1])
		v.screen[v.bot] = []rune(strings.Repeat(" ", v.cols))
	case v.r < v.rows-1:
		v.r++
	}
}

func (v *vt) Write(p []byte) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := []rune(string(p))
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '\r':
			v.c = 0
		case ch == '\n': // onlcr
			v.c = 0
			v.lineFeed()
		case ch == 0x1b && i+1 < len(s) && s[i+1] == '7':
			v.savedR, v.savedC = v.r, v.c
			i++
		case ch == 0x1b && i+1 < len(s) && s[i+1] == '8':
			v.r, v.c = v.savedR, v.savedC
			i++
		case ch == 0x1b && i+1 < len(s) && s[i+1] == '[':
			j := i + 2
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == ';') {
				j++
			}
			var ps []int
			for _, f := range strings.Split(string(s[i+2:j]), ";") {
				n, _ := strconv.Atoi(f)
				ps = append(ps, n)
			}
			arg := func(k, def int) int {
				if k < len(ps) && ps[k] > 0 {
					return ps[k]
				}
				return def
			}
			switch s[j] {
			case 'r':
				v.top, v.bot = arg(0, 1)-1, min(arg(1, v.rows), v.rows)-1
				v.r, v.c = 0, 0
			case 'H', 'f':
				v.r, v.c = min(arg(0, 1), v.rows)-1, min(arg(1, 1), v.cols)-1
			case 'A':
				v.r = max(0, v.r-arg(0, 1))
			case 'K':
				for k := v.c; k < v.cols; k++ {
					v.screen[v.r][k] = ' '
				}
			}
			i = j
		default:
			if v.c >= v.cols {
				v.c = 0
				v.lineFeed()
			}
			v.screen[v.r][v.c] = ch
			v.c++
		}
	}
	return len(p), nil
}

func (v *vt) lines() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]string, v.rows)
	for i, l := range v.screen {
		out[i] = strings.TrimRight(string(l), " ")
	}
	return out
}

// notYet answers GetRun as a collector that has no batch of the run yet.
type notYet struct {
	trainmeterv1.QueryServiceClient
}

func (notYet) GetRun(context.Context, *trainmeterv1.GetRunRequest, ...grpc.CallOption) (*trainmeterv1.GetRunResponse, error) {
	return nil, status.Error(codes.NotFound, "no such run")
}

// TestLiveLineNeverSharesALineWithTheCommand: on a terminal the live status
// and the command's output (written straight to the same terminal) never
// land on one line, whether the command writes between two redraws or
// scrolls the screen; once stopped, the status line is gone.
func TestLiveLineNeverSharesALineWithTheCommand(t *testing.T) {
	term := newVT(8, 100)
	_, _ = term.Write([]byte("$ trainmeter run -- python3 train.py\n"))
	o := &runOptions{runID: "r", tty: true, stderr: term, stdout: term, tick: time.Hour,
		termSize: func() (int, int, bool) { return 8, 100, true }}
	s := &runStatus{o: o, started: time.Now(), q: notYet{}, close: func() {}}
	shared := func(when string) {
		t.Helper()
		for i, l := range term.lines() {
			if strings.Contains(l, "trainmeter r |") && strings.Contains(l, "step") {
				t.Errorf("%s, row %d: %q: the live line and the command's output share a line", when, i, l)
			}
		}
	}
	stop := s.run()
	s.poll()
	_, _ = term.Write([]byte("step 1\nstep 2\n"))
	shared("the command wrote after the first draw")
	s.poll()
	shared("redrawn")
	for i := 3; i <= 12; i++ { // scrolls the screen
		_, _ = term.Write([]byte("step " + strconv.Itoa(i) + "\n"))
		shared("step " + strconv.Itoa(i))
	}
	s.poll()
	screen := term.lines()
	statusRows := 0
	for i, l := range screen {
		if strings.Contains(l, "trainmeter r |") {
			statusRows++
			if !strings.HasPrefix(l, "trainmeter r |") || strings.Contains(l, "step") || i != len(screen)-1 {
				t.Errorf("row %d: %q: the live line shares a row with the command's output, or is not the last row", i, l)
			}
		}
	}
	if statusRows != 1 {
		t.Errorf("%d rows with the live line, want 1:\n%s", statusRows, strings.Join(screen, "\n"))
	}
	if want := "step 12"; !strings.Contains(strings.Join(screen, "\n"), want) {
		t.Errorf("the command's last line %q is not on the screen:\n%s", want, strings.Join(screen, "\n"))
	}
	stop()
	screen = term.lines()
	for i, l := range screen {
		if strings.Contains(l, "trainmeter r |") {
			t.Errorf("row %d after stop: %q, want the live line gone", i, l)
		}
	}
	_, _ = term.Write([]byte("report\n"))
	if got := term.lines(); !strings.Contains(strings.Join(got, "\n"), "step 12\nreport") {
		t.Errorf("after stop, output does not follow the command's:\n%s", strings.Join(got, "\n"))
	}
}
