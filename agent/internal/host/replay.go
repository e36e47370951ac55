package host

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Replay plays a recorded or hand-written host trace back in real time,
// like the GPU replay backend: a Read returns the latest row whose time_s
// is at or before the time since the first Read. It lets tests and demos
// drive the host figures (RAM above a limit, a given CPU count) through
// the real agent honestly (docs/replay-format.md, "Host trace").
//
// CSV columns (header required, any order, case-insensitive):
// time_s, memory_used_mib, memory_total_mib (required), cpu_pct, cpu_count
// (optional; an empty cell reads as 0). '#' lines are comments.
type Replay struct {
	rows  []Reading
	ts    []float64
	clock clock.Clock

	mu sync.Mutex
	t0 time.Time
}

// OpenReplay reads a host trace file.
func OpenReplay(path string) (*Replay, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := ParseReplay(f, clock.Real{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// hostColumns are a host trace's columns: the first three required, the
// others read as 0 where absent or empty.
var hostColumns = [...]string{"time_s", "memory_used_mib", "memory_total_mib", "cpu_pct", "cpu_count"}

// ParseReplay reads a host trace; clk is the clock playback runs on.
func ParseReplay(rd io.Reader, clk clock.Clock) (*Replay, error) {
	cr := csv.NewReader(rd)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("host replay: header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.ToLower(strings.TrimSpace(h))] = i
	}
	for _, need := range hostColumns[:3] {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("host replay: header lacks column %q", need)
		}
	}
	r := &Replay{clock: clk}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("host replay: %w", err)
		}
		line, _ := cr.FieldPos(0)
		var vals [len(hostColumns)]float64
		for k, name := range hostColumns {
			i, ok := col[name]
			if !ok || i >= len(rec) || strings.TrimSpace(rec[i]) == "" {
				if k < 3 {
					return nil, fmt.Errorf("host replay: line %d: %s is empty", line, name)
				}
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[i]), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return nil, fmt.Errorf("host replay: line %d: %s = %q is not a finite number >= 0", line, name, rec[i])
			}
			vals[k] = v
		}
		if n := len(r.ts); n > 0 && vals[0] < r.ts[n-1] {
			return nil, fmt.Errorf("host replay: line %d: time_s %v is before the previous row's %v", line, vals[0], r.ts[n-1])
		}
		if vals[1] > vals[2] {
			return nil, fmt.Errorf("host replay: line %d: memory_used_mib %v exceeds memory_total_mib %v", line, vals[1], vals[2])
		}
		r.ts = append(r.ts, vals[0])
		r.rows = append(r.rows, Reading{MemUsedMiB: vals[1], MemTotalMiB: vals[2], CPUPct: math.Min(vals[3], 100), CPUCount: int(vals[4])})
	}
	if len(r.rows) == 0 {
		return nil, errors.New("host replay: no rows")
	}
	return r, nil
}

// Read implements Sampler.
func (r *Replay) Read() (Reading, error) {
	r.mu.Lock()
	now := r.clock.Now()
	if r.t0.IsZero() {
		r.t0 = now
	}
	el := now.Sub(r.t0).Seconds()
	r.mu.Unlock()
	i := sort.Search(len(r.ts), func(i int) bool { return r.ts[i] > el }) - 1 // the latest row with time_s <= el
	if i < 0 {
		return Reading{}, errors.New("host replay: before the trace's first row")
	}
	return r.rows[i], nil
}

var _ Sampler = (*Replay)(nil)
