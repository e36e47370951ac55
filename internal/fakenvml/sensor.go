// Package fakenvml is a fake libnvidia-ml.so.1 for tests (lib/fakenvml.c,
// built by Build, loaded by the real binaries through LD_LIBRARY_PATH and
// configured by the file in $FAKENVML_CONFIG), and its sensor model
// (sensor.c) compiled into this package: Model runs the very same C code on
// a virtual clock, for the accuracy study and the e2e tests' ground truth.
package fakenvml

/*
#cgo LDFLAGS: -lm
#include <stdlib.h>
#include "sensor.h"
*/
import "C"

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"unsafe"
)

// Model is one GPU of the sensor model. Not safe for concurrent use.
type Model struct {
	g C.fn_gpu
}

// NewModel returns GPU index's model with the library's defaults (an H100
// with the "ampere" sensor, 300 W constant).
func NewModel(index int) *Model {
	m := &Model{}
	C.fn_gpu_defaults(&m.g, C.int(index))
	return m
}

// Set sets one parameter, as a config line "key value" would.
func (m *Model) Set(key, val string) error {
	ck, cv := C.CString(key), C.CString(val)
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	switch C.fn_gpu_set(&m.g, ck, cv) {
	case 0:
		return nil
	case -1:
		return fmt.Errorf("fakenvml: unknown key %q", key)
	default:
		return fmt.Errorf("fakenvml: bad value %q for %s", val, key)
	}
}

// TrueEnergyJ is the ground-truth energy over [0, tMs).
func (m *Model) TrueEnergyJ(tMs float64) float64 {
	return float64(C.fn_true_energy_j(&m.g, C.double(tMs)))
}

// InstantW is field 186 at tMs and its sensor timestamp (ms).
func (m *Model) InstantW(tMs float64) (w, atMs float64) {
	var at C.double
	w = float64(C.fn_instant_w(&m.g, C.double(tMs), &at))
	return w, float64(at)
}

// AverageW is GetPowerUsage / field 185 at tMs and its sensor timestamp.
func (m *Model) AverageW(tMs float64) (w, atMs float64) {
	var at C.double
	w = float64(C.fn_average_w(&m.g, C.double(tMs), &at))
	return w, float64(at)
}

// CounterJ is the energy counter (field 83) at tMs and its sensor timestamp.
func (m *Model) CounterJ(tMs float64) (j, atMs float64) {
	var at C.double
	j = float64(C.fn_counter_j(&m.g, C.double(tMs), &at))
	return j, float64(at)
}

// UpdateMs is the sensor's update period.
func (m *Model) UpdateMs() int64 { return int64(m.g.update_ms) }

// Config is a parsed config file: the library-wide keys and GPU models built
// with the library's rules (unprefixed keys for every GPU, gpuN.key for one,
// later lines win).
type Config struct {
	GPUs    int
	EpochUs int64
	Models  []*Model
}

// ParseConfig reads config text as the library does.
func ParseConfig(text string) (*Config, error) {
	type kv struct {
		gpu      int // -1: all
		key, val string
	}
	c := &Config{GPUs: 2}
	var per []kv
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		key, val, _ := strings.Cut(strings.TrimSpace(line), " ")
		val = strings.TrimSpace(val)
		switch {
		case key == "":
		case key == "gpus" || key == "epoch_us":
			v, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %s: %w", n, key, err)
			}
			if key == "gpus" {
				c.GPUs = int(v)
			} else {
				c.EpochUs = v
			}
		case key == "driver_version" || key == "procs_file":
		case strings.HasPrefix(key, "gpu") && len(key) > 3 && key[3] >= '0' && key[3] <= '9':
			idx, k, ok := strings.Cut(key[3:], ".")
			i, err := strconv.Atoi(idx)
			if !ok || err != nil {
				return nil, fmt.Errorf("line %d: bad key %q", n, key)
			}
			per = append(per, kv{i, k, val})
		default:
			per = append(per, kv{-1, key, val})
		}
	}
	for i := range c.GPUs {
		m := NewModel(i)
		for _, p := range per {
			if p.gpu == -1 || p.gpu == i {
				if err := m.Set(p.key, p.val); err != nil {
					return nil, err
				}
			}
		}
		c.Models = append(c.Models, m)
	}
	return c, nil
}
