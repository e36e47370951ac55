// Package doctor implements `trainmeter-agent doctor`: checks, in plain
// words, of everything that makes the numbers missing or zero (the GPU
// backend, RAPL, the trainer socket, the collector, the spool), each one
// line with a status (OK, WARN, FAIL) and, where something is off, a hint.
//
// Nothing it does changes the state of a running agent or of the
// collector: the socket probe sends one unknown event (answered with an
// error line), and the ingest probe sends a Hello that the collector checks
// the token and node of and then refuses for its empty boot id.
package doctor

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/rapl"
	"github.com/trainmeter/trainmeter/internal/buildinfo"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Status is a check's verdict.
type Status string

// Statuses. FAIL makes the doctor exit non-zero; WARN does not.
const (
	OK   Status = "OK"
	Warn Status = "WARN"
	Fail Status = "FAIL"
)

// Sections of the report, in order.
const (
	SectionConfig    = "config"
	SectionGPU       = "gpu"
	SectionSocket    = "socket"
	SectionCollector = "collector"
	SectionSpool     = "spool"
)

// Check is one line of the report.
type Check struct {
	Section string `json:"section"`
	Name    string `json:"name"`
	Status  Status `json:"status"`
	Message string `json:"message"`
	Hint    string `json:"hint,omitempty"`
}

// Report is the doctor's result.
type Report struct {
	Node         string `json:"node"`
	AgentVersion string `json:"agent_version"`
	GPU          string `json:"gpu"`
	Socket       string `json:"socket"`
	Collector    string `json:"collector"`
	// CollectorMode is collector_mode: all (every batch to each) or any.
	CollectorMode string  `json:"collector_mode"`
	Spool         string  `json:"spool"`
	Checks        []Check `json:"checks"`
	// OK is false when any check failed.
	OK bool `json:"ok"`
}

func (r *Report) add(section, name string, st Status, msg, hint string) {
	r.Checks = append(r.Checks, Check{Section: section, Name: name, Status: st, Message: msg, Hint: hint})
	if st == Fail {
		r.OK = false
	}
}

// Count returns how many checks have status st.
func (r *Report) Count(st Status) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == st {
			n++
		}
	}
	return n
}

// Options configure Run.
type Options struct {
	// Config is the agent's resolved configuration (the same flags and file
	// the agent reads). It is checked with Validate first; the checks run
	// even when it has problems.
	Config     agentconfig.Config
	ConfigFile string // shown in the report ("" when flags only)
	// NVML returns the NVML library for --gpu nvml/auto; nil: nvml.New.
	// Tests inject go-nvml's mocks.
	NVML    func() nvml.Interface
	Gap     time.Duration // between the two live GPU reads; default 200 ms
	Timeout time.Duration // bounds each network check; default 5 s
	// Clock times the live GPU reads of the amd backend (default the wall
	// clock); Wait waits between them (default: on Clock). Tests move the
	// fixture's counters in Wait.
	Clock clock.Clock
	Wait  func(time.Duration)
	// RAPLReadFile reads the RAPL files; nil: os.ReadFile. Tests refuse
	// reads with it, which root's file modes cannot.
	RAPLReadFile rapl.ReadFileFunc
}

func (o Options) clock() clock.Clock { return cmp.Or[clock.Clock](o.Clock, clock.Real{}) }

func (o Options) wait(d time.Duration) {
	if o.Wait == nil {
		<-o.clock().After(d)
		return
	}
	o.Wait(d)
}

// Run runs every check and returns the report. It does not fail: problems
// are checks with status FAIL (Report.OK is then false).
func Run(ctx context.Context, o Options) *Report {
	if o.Gap <= 0 {
		o.Gap = 200 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.NVML == nil {
		o.NVML = func() nvml.Interface { return nvml.New() }
	}
	cfg := o.Config
	r := &Report{OK: true, Node: cfg.Node, AgentVersion: buildinfo.Version(), GPU: cfg.GPU, Socket: cfg.Socket,
		Collector: cfg.Collector, CollectorMode: cfg.CollectorMode, Spool: cfg.Spool}

	src := "flags and defaults"
	if o.ConfigFile != "" {
		src = o.ConfigFile + " and flags"
	}
	if err := cfg.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			r.add(SectionConfig, "config", Fail, line, "the agent refuses to start with this configuration ("+src+")")
		}
	} else {
		r.add(SectionConfig, "config", OK, "valid ("+src+")", "")
	}
	checkGPU(o, r)
	checkRAPL(o, r)
	checkAttribution(o, r)
	checkSocket(ctx, o, r)
	if cfg.AnyCollector() {
		checkAnyCollector(ctx, o, r)
	} else {
		// A pair: each collector is checked on its own (the lines name it).
		for _, addr := range cfg.Collectors() {
			one := o
			one.Config.Collector = addr
			checkCollector(ctx, one, r)
		}
	}
	checkSpool(o, r)
	return r
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for people: a header per section, one line per
// check, the hint under it, and a summary.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "trainmeter-agent doctor (agent %s, node %s)\n", r.AgentVersion, r.Node)
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	// What each section checked, beside its name.
	notes := map[string]string{
		SectionGPU: " (--gpu " + r.GPU + ")", SectionSocket: " (" + r.Socket + ")", SectionCollector: " (" + r.Collector + ")",
		SectionSpool: " (" + r.Spool + ")", SectionHostEnergy: " (RAPL: cpu_energy_J, dram_energy_J)",
	}
	if r.CollectorMode == agentconfig.ModeAny {
		notes[SectionCollector] = " (" + r.Collector + ", mode any)"
	}
	section := ""
	for _, c := range r.Checks {
		if c.Section != section {
			section = c.Section
			fmt.Fprintf(&b, "\n%s%s\n", section, notes[section])
		}
		fmt.Fprintf(&b, "  %-4s  %-*s  %s\n", c.Status, width, c.Name, c.Message)
		if c.Hint != "" {
			fmt.Fprintf(&b, "  %-4s  %-*s  hint: %s\n", "", width, "", c.Hint)
		}
	}
	fails, warns, oks := r.Count(Fail), r.Count(Warn), r.Count(OK)
	b.WriteString("\n")
	switch {
	case fails > 0:
		fmt.Fprintf(&b, "%d FAIL, %d WARN, %d OK: fix the FAIL lines above; until then the agent will not measure (or not report) here.\n", fails, warns, oks)
	case warns > 0:
		fmt.Fprintf(&b, "0 FAIL, %d WARN, %d OK: the agent can run; the WARN lines say what may be missing or less exact.\n", warns, oks)
	default:
		fmt.Fprintf(&b, "all %d checks OK.\n", oks)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
