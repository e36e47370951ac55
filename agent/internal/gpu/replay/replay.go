// Package replay plays a GPU trace (CSV, docs/replay-format.md) back in real
// time, as a gpu.Backend. Playback starts at the first Read (t0, unless
// StartAt anchors it); a Read at now returns, per GPU, the latest row with
// time_s <= now-t0, each value stamped t0+time_s, so a row read twice is
// recognised as stale by its timestamp, as with NVML's field timestamps.
package replay

import (
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// Column names of the trace header.
const (
	ColTime     = "time_s"
	ColGPU      = "gpu"
	ColPower    = "power_w"
	ColEnergy   = "energy_j"
	ColMemUsed  = "memory_used_mib"
	ColMemTotal = "memory_total_mib"
	ColUtil     = "utilization_pct"
)

// Optional per-run columns: the prefix, then the run id (case kept), e.g.
// "run_sm_pct:job-a". They say what the run's processes did on the row's
// GPU (docs/replay-format.md): an empty cell means no process of the run.
const (
	ColRunSMPrefix  = "run_sm_pct:"
	ColRunMemPrefix = "run_mem_mib:"
)

// Optional per-GPU identity columns: the first non-empty cell of a GPU
// names it; a GPU's later rows may repeat it or leave it empty.
const (
	ColVendor = "vendor" // nvidia or amd
	ColName   = "name"   // the GPU's model name
)

// Vendors a trace may name.
var Vendors = []string{"nvidia", "amd"}

// Columns is the required header, in the order the docs and examples use.
var Columns = []string{ColTime, ColGPU, ColPower, ColEnergy, ColMemUsed, ColMemTotal, ColUtil}

// maxGPUs bounds the gpu column, so a typo cannot allocate millions of GPUs.
const maxGPUs = 1024

// Backend plays a trace. It implements gpu.Backend and is safe for
// concurrent use.
type Backend struct {
	devs []gpu.Device
	rows [][]row // per GPU, in time order

	mu      sync.Mutex
	started bool
	t0      time.Time
}

type row struct {
	at       time.Duration // time_s
	powerW   float64
	energyJ  float64
	energyOK bool
	memUsed  float64
	memTotal float64
	util     float64
	utilOK   bool
	runs     map[string]gpu.ProcessUse // per-run columns, nil without them
}

type runCol struct {
	idx  int
	name string // as the header writes it (cr.ReuseRecord reuses the header's slice for rows)
	run  string
	mem  bool
}

// Open parses the trace file at path.
func Open(path string) (*Backend, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	b, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// Parse reads a trace. Errors name the line of the offending row.
func Parse(r io.Reader) (*Backend, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true

	header, err := cr.Read()
	if err == io.EOF {
		return nil, errors.New("replay: empty trace: want a header line " + strings.Join(Columns, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	line, _ := cr.FieldPos(0)
	col := make(map[string]int, len(header))
	var runCols []runCol
	for i, h := range header {
		orig := strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		h = strings.ToLower(orig)
		for _, p := range []string{ColRunSMPrefix, ColRunMemPrefix} {
			if strings.HasPrefix(h, p) {
				id := orig[len(p):]
				if id == "" {
					return nil, fmt.Errorf("replay: line %d: column %q names no run id", line, orig)
				}
				runCols = append(runCols, runCol{idx: i, name: orig, run: id, mem: p == ColRunMemPrefix})
			}
		}
		if _, dup := col[h]; dup && h != "" {
			return nil, fmt.Errorf("replay: line %d: column %q appears twice", line, h)
		}
		col[h] = i
	}
	idx := make([]int, len(Columns))
	for k, name := range Columns {
		i, ok := col[name]
		if !ok {
			return nil, fmt.Errorf("replay: line %d: header lacks column %q (want %s)", line, name, strings.Join(Columns, ","))
		}
		idx[k] = i
	}

	colOr := func(name string) int { // -1 for an absent optional column
		if i, ok := col[name]; ok {
			return i
		}
		return -1
	}
	vendorCol, nameCol := colOr(ColVendor), colOr(ColName)
	var vendors, names []string // per GPU
	var rows [][]row
	var firstLine []int // per GPU: the line of its first row
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		line, _ := cr.FieldPos(0)
		raw := func(i int) string {
			if i < 0 || i >= len(rec) {
				return ""
			}
			return rec[i]
		}
		cell := func(i int) string { return strings.TrimSpace(raw(i)) }
		bad := func(format string, a ...any) error {
			return fmt.Errorf("replay: line %d: "+format, append([]any{line}, a...)...)
		}
		gs := cell(idx[1])
		g, err := strconv.Atoi(gs)
		if err != nil || g < 0 || g >= maxGPUs {
			return nil, bad("gpu = %q is not a GPU index (0..%d)", gs, maxGPUs-1)
		}
		var v [7]float64
		var ok [7]bool
		for k, name := range Columns {
			f := cell(idx[k])
			switch {
			case k == 1: // gpu, parsed above
			case f == "" && (k == 3 || k == 6): // energy and utilisation may be empty
			case f == "":
				return nil, bad("%s is empty", name)
			default:
				x, err := strconv.ParseFloat(f, 64)
				if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
					return nil, bad("%s = %q is not a finite number", name, f)
				}
				if x < 0 {
					return nil, bad("%s = %q is negative", name, f)
				}
				if k == 0 && x > float64(math.MaxInt64/int64(time.Second)) {
					return nil, bad("time_s = %v is too large", x)
				}
				v[k], ok[k] = x, true
			}
		}
		if v[6] > 100 {
			return nil, bad("utilization_pct = %v is over 100", v[6])
		}
		rw := row{at: time.Duration(math.Round(v[0] * float64(time.Second))), powerW: v[2], energyJ: v[3], energyOK: ok[3],
			memUsed: v[4], memTotal: v[5], util: v[6], utilOK: ok[6]}
		for _, rc := range runCols {
			cs := cell(rc.idx)
			if cs == "" {
				continue
			}
			v, err := strconv.ParseFloat(cs, 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return nil, bad("%s = %q is not a finite non-negative number", rc.name, cs)
			}
			if !rc.mem && v > 100 {
				return nil, bad("%s = %v is over 100", rc.name, v)
			}
			if rw.runs == nil {
				rw.runs = map[string]gpu.ProcessUse{}
			}
			u := rw.runs[rc.run]
			if rc.mem {
				u.MemMiB, u.MemOK = v, true
			} else {
				u.SMPct, u.SMOK = v, true
			}
			rw.runs[rc.run] = u
		}

		for len(rows) <= g {
			rows, firstLine = append(rows, nil), append(firstLine, 0)
			vendors, names = append(vendors, ""), append(names, "")
		}
		vendor := strings.ToLower(cell(vendorCol))
		if vendor != "" && !slices.Contains(Vendors, vendor) {
			return nil, bad("%s = %q: want one of %s", ColVendor, raw(vendorCol), strings.Join(Vendors, ", "))
		}
		// The first non-empty cell names the GPU; later ones must agree.
		for _, id := range []struct {
			what string
			dst  *string
			v    string
		}{{ColVendor, &vendors[g], vendor}, {ColName, &names[g], cell(nameCol)}} {
			if id.v != "" && *id.dst != "" && *id.dst != id.v {
				return nil, bad("gpu %d: %s %q differs from its earlier %q (one GPU, one %s)", g, id.what, id.v, *id.dst, id.what)
			}
			*id.dst = cmp.Or(id.v, *id.dst)
		}
		if n := len(rows[g]); n > 0 && rw.at < rows[g][n-1].at {
			return nil, bad("gpu %d: time_s %v is before the previous row's %v (times must not decrease per GPU)",
				g, rw.at.Seconds(), rows[g][n-1].at.Seconds())
		}
		if len(rows[g]) == 0 {
			firstLine[g] = line
		}
		rows[g] = append(rows[g], rw)
	}
	if len(rows) == 0 {
		return nil, errors.New("replay: trace has a header but no rows")
	}
	empty := func(rs []row) bool { return len(rs) == 0 }
	if g := slices.IndexFunc(rows, empty); g >= 0 {
		// Name the first row of the GPU after the gap (the last GPU has rows).
		at := firstLine[g+slices.IndexFunc(rows[g:], func(rs []row) bool { return !empty(rs) })]
		return nil, fmt.Errorf("replay: line %d: unknown gpu %d: gpu %d has no rows (indices must be contiguous from 0)", at, len(rows)-1, g)
	}

	b := &Backend{rows: rows, devs: make([]gpu.Device, len(rows))}
	for g, rs := range rows {
		b.devs[g] = gpu.Device{Index: g, UUID: fmt.Sprintf("GPU-replay-%d", g), Name: cmp.Or(names[g], "Replay GPU"), Vendor: vendors[g],
			MemTotalMiB: uint64(math.Round(rs[0].memTotal)), HasInstantPower: true,
			HasEnergyCounter: slices.ContainsFunc(rs, func(r row) bool { return r.energyOK })}
	}
	return b, nil
}

// Devices implements gpu.Backend.
func (b *Backend) Devices() []gpu.Device { return slices.Clone(b.devs) }

// Duration is the time_s of the last row of any GPU: how long playback lasts.
func (b *Backend) Duration() time.Duration {
	var d time.Duration
	for _, rs := range b.rows {
		d = max(d, rs[len(rs)-1].at)
	}
	return d
}

// StartAt anchors playback: trace time 0 is t0 instead of the first Read.
// Two agent processes anchored alike see one continuous trace, as a real
// GPU's energy counter keeps counting while an agent restarts.
func (b *Backend) StartAt(t0 time.Time) {
	b.mu.Lock()
	b.started, b.t0 = true, t0
	b.mu.Unlock()
}

// Read implements gpu.Backend. The first Read starts playback.
func (b *Backend) Read(now time.Time, dst []gpu.Sample) error {
	if len(dst) != len(b.devs) {
		return fmt.Errorf("replay: Read: len(dst) = %d, want %d", len(dst), len(b.devs))
	}
	b.mu.Lock()
	if !b.started {
		b.started, b.t0 = true, now
	}
	t0 := b.t0
	b.mu.Unlock()

	el := now.Sub(t0)
	for g, rs := range b.rows {
		s := gpu.Sample{Index: g, ReadAt: now}
		k := latest(rs, el)
		if k < 0 {
			dst[g] = s // before the GPU's first row: nothing OK, no error
			continue
		}
		r := &rs[k]
		at := t0.Add(r.at)
		s.PowerW, s.PowerAt, s.PowerOK = r.powerW, at, true
		if r.energyOK {
			s.EnergyJ, s.EnergyAt, s.EnergyOK = r.energyJ, at, true
		}
		s.MemUsedMiB, s.MemTotalMiB, s.MemOK = r.memUsed, r.memTotal, true
		if r.utilOK {
			s.UtilPct, s.UtilOK = r.util, true
		}
		dst[g] = s
	}
	return nil
}

// RunUsage implements gpu.RunUsageReader from the per-run columns of the
// latest row of GPU index at now; nil before playback or without them.
func (b *Backend) RunUsage(index int, now time.Time) map[string]gpu.ProcessUse {
	b.mu.Lock()
	started, t0 := b.started, b.t0
	b.mu.Unlock()
	if !started || index < 0 || index >= len(b.rows) {
		return nil
	}
	rs := b.rows[index]
	k := latest(rs, now.Sub(t0))
	if k < 0 {
		return nil
	}
	return maps.Clone(rs[k].runs)
}

// latest is the index of the latest row with at <= el, -1 when none.
func latest(rs []row, el time.Duration) int {
	return sort.Search(len(rs), func(i int) bool { return rs[i].at > el }) - 1
}

// Close implements gpu.Backend.
func (b *Backend) Close() error { return nil }

var (
	_ gpu.Backend        = (*Backend)(nil)
	_ gpu.RunUsageReader = (*Backend)(nil)
)
