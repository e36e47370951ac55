package cli

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/pkg/trainerwire"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// `trainmeter run -- COMMAND`: zero-code measurement. It only speaks the
// agent's socket protocol and the collector's query API (no NVML here).

// The environment `trainmeter run` passes to the command (the Python client
// reads both) and the agent's default socket, as the protocol defines them.
const (
	EnvSocket     = trainerwire.EnvSocket
	EnvRunID      = trainerwire.EnvRunID
	DefaultSocket = trainerwire.DefaultSocket
)

// ExitError carries the exit code of a command `trainmeter run` ran; Main
// exits with it without printing anything.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// runOptions is what `trainmeter run` was asked to do.
type runOptions struct {
	socket, runID string
	// collectors is how many --collector addresses were given: with more
	// than one, the live status moves to another when its collector stops
	// answering.
	collectors int
	// resume continues a run that has ended (run_start resume=true).
	resume      bool
	start       trainerwire.RunStart // run_start metadata the user gave
	statusEvery time.Duration        // plain status lines when not a terminal
	reportWait  time.Duration        // how long to wait for the collector to see the end
	tty         bool                 // a live line on the terminal's bottom row
	// termSize is the terminal's rows and columns (ok false: not known);
	// with tty, the live line keeps the bottom row to itself.
	termSize func() (rows, cols int, ok bool)

	stdin          io.Reader
	stdout, stderr io.Writer
	// signals, when set, replaces signal.Notify (tests).
	signals <-chan os.Signal
	// query dials the collector; nil: no live status and no report.
	query func() (trainmeterv1.QueryServiceClient, func(), error)
	// tick is the live status period on a terminal.
	tick time.Duration

	// maxCost caps the run's total cost (0: none); estimate asks for an
	// estimate at start (nil: none). plan sends both to the collector.
	maxCost   float64
	estimate  *trainmeterv1.EstimateRequest
	plan      func(*trainmeterv1.PlanRunRequest) (*trainmeterv1.PlanRunResponse, error)
	stopGrace time.Duration // SIGTERM to SIGKILL when the cap stops the command
}

func newRunCommand(cf *clientFlags) *cobra.Command {
	o := &runOptions{tick: time.Second}
	o.start.Start = &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{}} // the flags write into it
	var labels []string
	var batchSize, seqLen int64
	var warmup time.Duration
	var tokens uint64
	var gpus uint32
	c := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARGS...]",
		Short: "Run a command as one measured run: energy, time, power, VRAM, cost (and tokens if it uses the client)",
		Long: `Run COMMAND as one trainmeter run. The agent on this machine attributes to it
the GPUs its process tree computes on, from start to exit. The command gets
TRAINMETER_RUN_ID and TRAINMETER_SOCKET, so a script that uses the Python
client reports its tokens into the same run and fills the metadata not given
here (flags given here win over the script's; a difference is shown on stderr). SIGINT and SIGTERM are passed on to the command;
trainmeter exits with the command's exit code. If the agent cannot be reached
the command still runs, unmeasured.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			md := o.start.Start.Metadata
			if f.Changed("batch-size") {
				md.BatchSize = &batchSize
			}
			if f.Changed("seq-len") {
				md.SeqLen = &seqLen
			}
			if f.Changed("budget-scope") && o.start.Start.BudgetScope == "" {
				return errors.New("--budget-scope is empty: give the scope whose budget this run counts against, e.g. --budget-scope team-nlp (trainmeter budget set SCOPE USD)")
			}
			lm, err := parseLabels("--label", labels)
			if err != nil {
				return err
			}
			// The protocol takes labels as run_start's extra scalar keys
			// (docs/protocol.md): a key run_start reads itself would set
			// that field instead.
			for k, v := range lm {
				if trainerwire.IsRunStartKey(k) {
					return fmt.Errorf("--label %s=%s: %q is a run_start field, not a label; use its own flag (trainmeter run --help) or another key", k, v, k)
				}
			}
			o.start.Start.Labels = lm
			if f.Changed("warmup") {
				if warmup < 0 {
					return fmt.Errorf("--warmup %v: must not be negative", warmup)
				}
				w := warmup.Seconds()
				o.start.WarmupS = &w
			}
			if o.maxCost < 0 || math.IsNaN(o.maxCost) || math.IsInf(o.maxCost, 0) {
				return fmt.Errorf("--max-cost %v: want a finite number of USD > 0", o.maxCost)
			}
			if tokens > 0 {
				if md.Model == "" {
					return errors.New("--tokens needs --model: the estimate learns from the model's past runs")
				}
				o.estimate = &trainmeterv1.EstimateRequest{Model: md.Model, Tokens: tokens, Gpus: gpus}
			}
			// A malformed address is a typo to fix now, not a collector that
			// is down (then the run is still measured, and reported later).
			if err := cf.checkAddrs(); err != nil {
				return err
			}
			if o.statusEvery <= 0 {
				return fmt.Errorf("--status-every %v: must be positive", o.statusEvery)
			}
			o.socket = cmp.Or(o.socket, cf.getenv(EnvSocket), DefaultSocket)
			if o.runID == "" {
				o.runID = newRunID(args[0])
			}
			o.stdin, o.stdout, o.stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			if f, ok := o.stderr.(*os.File); ok && isTTY(f) {
				o.termSize = func() (int, int, bool) { return termSize(f) }
				// A live line needs the terminal's size; without it, plain lines.
				_, _, o.tty = o.termSize()
			}
			o.query = func() (trainmeterv1.QueryServiceClient, func(), error) {
				conn, err := cf.dial(context.Background(), o.stderr)
				if err != nil {
					return nil, nil, err
				}
				return trainmeterv1.NewQueryServiceClient(conn), func() { conn.Close() }, nil
			}
			o.collectors = len(cf.addrs)
			o.plan = func(req *trainmeterv1.PlanRunRequest) (*trainmeterv1.PlanRunResponse, error) {
				// Both of a pair keep the cap, so either stops the run.
				var resp *trainmeterv1.PlanRunResponse
				err := cf.callEach(cmd, "plan", func(ctx context.Context, conn *grpc.ClientConn) error {
					r, err := trainmeterv1.NewBudgetServiceClient(conn).PlanRun(ctx, req)
					if err == nil && resp == nil {
						resp = r
					}
					return err
				})
				if pe := (*partialError)(nil); errors.As(err, &pe) {
					fmt.Fprintf(o.stderr, "trainmeter: the run's plan (--max-cost, --tokens) is kept by %s only: %s did not take it (%v); it will not stop the run\n",
						strings.Join(pe.done, ", "), strings.Join(pe.failed, ", "), pe.err)
					return resp, nil
				}
				return resp, err
			}
			if err := refuseEndedRun(cmd.Context(), o); err != nil {
				return err
			}
			code := runCommand(o, args)
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	f := c.Flags()
	// Flags end at COMMAND: `trainmeter run python3 train.py --lr 3` works
	// without "--".
	f.SetInterspersed(false)
	f.StringVar(&o.socket, "socket", "", "agent socket (default $"+EnvSocket+", else "+DefaultSocket+")")
	f.StringVar(&o.runID, "run-id", "", "run id (default: generated from the command's name and the time)")
	f.BoolVar(&o.resume, "resume", false, "continue the run --run-id names after it ended (the time in between is in no rate)")
	f.StringVar(&o.start.Start.Metadata.Model, "model", "", "model name")
	f.StringVar(&o.start.Start.Metadata.Dataset, "dataset", "", "dataset name")
	f.StringVar(&o.start.Start.Metadata.Backend, "backend", "", "training backend (e.g. unsloth, deepspeed)")
	f.StringVar(&o.start.Start.Metadata.Optimizer, "optimizer", "", "optimizer")
	f.StringVar(&o.start.Start.Metadata.Precision, "precision", "", "precision (e.g. bf16)")
	f.Int64Var(&batchSize, "batch-size", 0, "batch size")
	f.Int64Var(&seqLen, "seq-len", 0, "sequence length")
	f.StringVar(&o.start.Start.Metadata.Notes, "notes", "", "free-form notes")
	f.StringArrayVar(&labels, "label", nil, "label KEY=VALUE of the run (repeatable), for budgets (label:KEY=VALUE) and runs --label")
	f.StringVar(&o.start.Start.BudgetScope, "budget-scope", "", "the budget scope this run counts against (docs/budgets.md)")
	f.DurationVar(&warmup, "warmup", 0, "warmup to exclude from efficiency figures (default: the script's client's, else the agent's)")
	f.DurationVar(&o.statusEvery, "status-every", 10*time.Second, "period of the status lines when stderr is not a terminal")
	f.Float64Var(&o.maxCost, "max-cost", 0, "USD: the collector tells the run to stop (and alerts) when its total cost reaches this; trainmeter run then stops the command")
	f.Var(&tokenCount{&tokens}, "tokens", "tokens the run will process: estimate its time, energy and cost at start from --model's past runs (shown in its report)")
	f.Uint32Var(&gpus, "gpus", 0, "GPUs the run will use, for the estimate (default: the past runs' median)")
	f.DurationVar(&o.stopGrace, "stop-grace", 30*time.Second, "after --max-cost stopped the command with SIGTERM, SIGKILL it this much later")
	f.DurationVar(&o.reportWait, "report-wait", 10*time.Second, "how long to wait for the collector to see the run end before printing the report")
	return c
}

// newRunID is NAME-YYYYMMDD-HHMMSS-XXXX from the command's base name.
func newRunID(command string) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '-'
	}, filepath.Base(command))
	if len(name) > 32 {
		name = name[:32]
	}
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%s-%s", name, time.Now().Format("20060102-150405"), hex.EncodeToString(b))
}

// runCommand runs args as one run and returns the exit code to exit with.
func runCommand(o *runOptions, args []string) int {
	warn := func(format string, a ...any) { fmt.Fprintf(o.stderr, "trainmeter: "+format+"\n", a...) }
	path, err := exec.LookPath(args[0])
	if err != nil {
		warn("%v", err)
		return 127
	}

	planRun(o, warn)
	ag := newAgentLink(o, warn)
	ag.start()

	child := exec.Command(path, args[1:]...)
	child.Args[0] = args[0]
	child.Stdin, child.Stdout, child.Stderr = o.stdin, o.stdout, o.stderr
	child.Env = append(os.Environ(), EnvRunID+"="+o.runID, EnvSocket+"="+o.socket)
	if err := child.Start(); err != nil {
		warn("%v", err)
		ag.end("not started")
		return 126
	}

	sigs := o.signals
	if sigs == nil {
		ch := make(chan os.Signal, 4)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
		defer signal.Stop(ch)
		sigs = ch
	}
	waited := make(chan error, 1)
	go func() { waited <- child.Wait() }()

	st := newStatus(o, ag.reachable.Load())
	stopStatus := st.run()

	var werr error
	capped := false
	var kill <-chan time.Time
wait:
	for {
		select {
		case reason := <-ag.stops:
			if o.maxCost <= 0 || !strings.HasPrefix(reason, maxCostPrefix) || capped {
				continue
			}
			capped = true
			warn("%s: stopping the command (SIGTERM; SIGKILL in %v)", reason, o.stopGrace)
			_ = child.Process.Signal(syscall.SIGTERM)
			kill = time.After(o.stopGrace)
		case <-kill:
			_ = child.Process.Kill()
		case s := <-sigs:
			if s == syscall.SIGINT && foregroundTTY() {
				// Ctrl-C on the terminal reached the command's process
				// group (ours) already: a second SIGINT could break its
				// own clean-up.
				continue
			}
			_ = child.Process.Signal(s)
		case werr = <-waited:
			break wait
		}
	}
	stopStatus()
	status, code := exitStatus(child.ProcessState, werr)
	if capped {
		status = "stopped: max-cost"
	}
	st.endSent = time.Now()
	ag.end(status)
	switch {
	case ag.refused.Load():
		warn("run %s was not measured: the agent refused it (above)", o.runID)
	case ag.reachable.Load():
		st.final()
	}
	return code
}

// exitStatus is the run_end status ("exit 3", "signal SIGTERM") and the
// exit code to pass on (128+N for a signal, as shells do).
func exitStatus(ps *os.ProcessState, err error) (string, int) {
	if ps == nil {
		return "failed: " + fmt.Sprint(err), 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + signalName(ws.Signal()), 128 + int(ws.Signal())
	}
	return fmt.Sprintf("exit %d", ps.ExitCode()), ps.ExitCode()
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
	syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return fmt.Sprintf("signal %d", int(s))
}

// agentLink is the connection to the agent that carries the run's
// run_start and run_end. Measuring never gets in the command's way: if the
// agent is unreachable it warns once; if the connection drops (agent
// restart), it reconnects in the background and re-sends run_start with the
// same client_id, so the agent resumes the run.
type agentLink struct {
	o        *runOptions
	warn     func(string, ...any)
	start0   []byte
	clientID string

	// reachable: run_start reached the agent. refused: the agent refused it
	// (an ended run id, too many runs): the command runs unmeasured and no
	// report is printed.
	reachable, refused, warned atomic.Bool

	mu     sync.Mutex
	conn   net.Conn
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
	// stops carries a max-cost stop to the command's supervisor; one is
	// enough (the agent may relay the advice again), so more are dropped.
	stops chan string
}

func newAgentLink(o *runOptions, warn func(string, ...any)) *agentLink {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	a := &agentLink{o: o, warn: warn, clientID: "trainmeter-run-" + hex.EncodeToString(b), done: make(chan struct{}), stops: make(chan string, 1)}
	ev := o.start
	ev.RunID, ev.AttributePID, ev.ClientID, ev.Resume = o.runID, os.Getpid(), a.clientID, o.resume
	// Labels were checked against the run_start fields when parsed.
	a.start0, _ = json.Marshal(ev)
	a.start0 = append(a.start0, '\n')
	return a
}

// refuseEndedRun refuses, before the command starts, a --run-id that names
// a run the collector has seen end, unless --resume: measuring it again
// would reopen it (the agent refuses too, but only for runs it ended
// itself, and only once the command is already running). A collector that
// cannot be asked leaves the decision to the agent.
func refuseEndedRun(ctx context.Context, o *runOptions) error {
	if o.resume || o.query == nil {
		return nil
	}
	qc, closeConn, err := o.query()
	if err != nil {
		return nil
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := qc.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: o.runID})
	if err != nil || !resp.GetRun().GetEnded() {
		return nil
	}
	r := resp.GetRun()
	return fmt.Errorf("run %q already ended at %s (%s): use a new --run-id (or none, to have one generated) for a new run, "+
		"or add --resume to continue this one (the time in between counts in no rate)",
		o.runID, r.GetEnd().AsTime().UTC().Format(time.RFC3339), report.EndStatus(r))
}

func (a *agentLink) start() {
	if err := a.connect(); err != nil {
		a.warnOnce("agent not reachable at %s (%v): running the command unmeasured", a.o.socket, err)
	}
}

// connect dials the agent and sends run_start.
func (a *agentLink) connect() error {
	conn, err := net.DialTimeout("unix", a.o.socket, 2*time.Second)
	if err != nil {
		return err
	}
	_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write(a.start0); err != nil {
		conn.Close()
		return err
	}
	_ = conn.SetWriteDeadline(time.Time{})
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		return errors.New("closed")
	}
	a.conn = conn
	a.mu.Unlock()
	a.reachable.Store(true)
	a.wg.Add(1)
	go a.read(conn)
	return nil
}

// read shows the agent's error lines (e.g. a refused run_start); when the
// connection drops before end, it reconnects every 2 s (the new connection
// has its own reader).
func (a *agentLink) read(conn net.Conn) {
	defer a.wg.Done()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		var m struct{ Event, Error, Reason string }
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		switch m.Event {
		case trainerwire.EventError:
			a.warn("agent: %s", m.Error)
			if strings.HasPrefix(m.Error, "run_start:") {
				a.refused.Store(true)
			}
		case trainerwire.EventStop:
			if a.o.maxCost > 0 && strings.HasPrefix(m.Reason, maxCostPrefix) {
				select {
				case a.stops <- m.Reason:
				default:
				}
				continue
			}
			a.warn("agent asks the run to stop: %s (the command is not stopped by trainmeter run)", m.Reason)
		}
	}
	a.mu.Lock()
	if a.conn == conn {
		a.conn = nil
	}
	closed := a.closed
	a.mu.Unlock()
	conn.Close()
	if closed {
		return
	}
	a.warnOnce("lost the connection to the agent; reconnecting")
	for {
		select {
		case <-a.done:
			return
		case <-time.After(2 * time.Second):
		}
		if a.connect() == nil {
			return
		}
	}
}

func (a *agentLink) warnOnce(format string, args ...any) {
	if a.warned.CompareAndSwap(false, true) {
		a.warn(format, args...)
	}
}

// end sends run_end with the command's status (reconnecting once if the
// connection is down) and closes the link.
func (a *agentLink) end(status string) {
	close(a.done)
	line, _ := json.Marshal(trainerwire.RunEnd{Event: trainerwire.EventRunEnd, RunID: a.o.runID, Status: status})
	line = append(line, '\n')
	send := func() bool {
		a.mu.Lock()
		conn := a.conn
		a.mu.Unlock()
		if conn == nil {
			return false
		}
		_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, err := conn.Write(line)
		return err == nil
	}
	if a.reachable.Load() && !send() {
		if a.connect() == nil {
			send()
		}
	}
	a.mu.Lock()
	a.closed = true
	conn := a.conn
	a.mu.Unlock()
	if conn != nil {
		// Closing the write side lets the agent read run_end before EOF;
		// the reader then sees the agent close.
		if uc, ok := conn.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		} else {
			conn.Close()
		}
	}
	a.wg.Wait()
}

// maxCostPrefix starts the reason of the collector's stop advice for a run
// that reached its --max-cost (budget.MaxCostReasonPrefix).
const maxCostPrefix = "max-cost"

// planRun sends the run's cap and estimate request to the collector before
// the command starts, keeps the plan's key for the run's run_start, and
// shows the estimate. An unreachable collector only means no cap and no
// estimate, which it says: the command runs regardless.
func planRun(o *runOptions, warn func(string, ...any)) {
	if o.plan == nil || (o.maxCost <= 0 && o.estimate == nil) {
		return
	}
	// The plan applies only to the run whose run_start presents its key; one
	// key for every collector of a pair, each of which keeps the plan.
	raw := make([]byte, 16)
	_, _ = rand.Read(raw)
	key := hex.EncodeToString(raw)
	resp, err := o.plan(&trainmeterv1.PlanRunRequest{RunId: o.runID, MaxCostUsd: o.maxCost, Estimate: o.estimate, PlanKey: key})
	if err != nil {
		if o.maxCost > 0 {
			warn("could not set --max-cost at the collector (%v): the run is NOT capped", err)
		} else {
			warn("no estimate (%v)", err)
		}
		return
	}
	if o.start.Start == nil {
		o.start.Start = &trainmeterv1.RunStart{}
	}
	o.start.Start.PlanKey = key
	if e := resp.GetEstimate(); e != nil {
		writeEstimate(o.stderr, e)
		if o.maxCost > 0 && e.CostUsd != nil && e.GetCostUsd().GetMid() > o.maxCost {
			amounts := money.USDs(e.GetCostUsd().GetMid(), o.maxCost)
			warn("the estimate (%s) is above --max-cost (%s): the run will likely be stopped before it finishes", amounts[0], amounts[1])
		}
	} else if msg := resp.GetEstimateError(); msg != "" {
		warn("no estimate: %s", msg)
	}
	if o.maxCost > 0 {
		warn("run %s is capped at %s: the collector tells it to stop when its total cost reaches that", o.runID, money.USD(o.maxCost))
	}
}
