// Package gpuopen turns the agent's --gpu flag into a gpu.Backend.
//
// Specs:
//
//	nvml         real GPUs through NVML (fails if NVML does not initialise)
//	sim:N        N simulated GPUs (1..64), seed 1; sim:N:SEED picks the seed;
//	             a bare "sim" means sim:2
//	amd          AMD GPUs through the amdgpu driver's sysfs files (internal/gpu/amdgpu)
//	replay:FILE  play the CSV trace FILE in real time (docs/replay-format.md)
//	auto or ""   nvml if it initialises; else amd when amdgpu cards are found
//	             and no NVIDIA GPU is on the PCI bus; else an error naming
//	             --gpu sim:2
package gpuopen

import (
	"cmp"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/nvmlgpu"
	"github.com/trainmeter/trainmeter/agent/internal/gpu/replay"
	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdsmi"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// Kind is the backend a spec names.
type Kind string

// Kinds of backend.
const (
	KindAuto   Kind = "auto"
	KindNVML   Kind = "nvml"
	KindAMD    Kind = "amd"
	KindSim    Kind = "sim"
	KindReplay Kind = "replay"
)

// Bounds and defaults of sim:N[:SEED].
const (
	MaxSimGPUs     = 64 // the largest N
	DefaultSimSeed = 1  // the seed when none is given
)

// Usage describes the accepted specs, for flag help.
const Usage = "GPU backend: nvml, amd, sim:N (N simulated GPUs, 1..64), replay:FILE (CSV trace), or auto (nvml if it initialises, else amd if amdgpu cards and no NVIDIA GPU are found)"

// Spec is a parsed --gpu value.
type Spec struct {
	Kind Kind
	N    int    // sim: number of GPUs
	Seed int64  // sim: seed
	Path string // replay: trace file
	// Start anchors replay playback (zero: at the agent's first read).
	Start time.Time
}

// ParseSpec parses a --gpu value without opening anything.
func ParseSpec(spec string) (Spec, error) {
	s := strings.TrimSpace(spec)
	kind, arg, hasArg := strings.Cut(s, ":")
	switch strings.ToLower(kind) {
	case "", string(KindAuto), string(KindNVML), string(KindAMD):
		k := Kind(cmp.Or(strings.ToLower(kind), string(KindAuto)))
		if hasArg {
			return Spec{}, fmt.Errorf("--gpu %q: %s takes no argument (%s)", spec, k, Usage)
		}
		return Spec{Kind: k}, nil
	case string(KindSim):
		if !hasArg {
			return Spec{Kind: KindSim, N: 2, Seed: DefaultSimSeed}, nil
		}
		ns, seeds, hasSeed := strings.Cut(arg, ":")
		n, err := strconv.Atoi(strings.TrimSpace(ns))
		if err != nil || n < 1 || n > MaxSimGPUs {
			return Spec{}, fmt.Errorf("--gpu %q: sim:N needs a number of GPUs N from 1 to %d", spec, MaxSimGPUs)
		}
		seed := int64(DefaultSimSeed)
		if hasSeed {
			seed, err = strconv.ParseInt(strings.TrimSpace(seeds), 10, 64)
			if err != nil {
				return Spec{}, fmt.Errorf("--gpu %q: sim:N:SEED needs an integer seed", spec)
			}
		}
		return Spec{Kind: KindSim, N: n, Seed: seed}, nil
	case string(KindReplay):
		if strings.TrimSpace(arg) == "" {
			return Spec{}, fmt.Errorf("--gpu %q: replay:FILE needs a trace file (see docs/replay-format.md)", spec)
		}
		// replay:FILE@UNIX_SECONDS anchors trace time 0 at that instant.
		if i := strings.LastIndex(arg, "@"); i > 0 {
			secs, err := strconv.ParseFloat(arg[i+1:], 64)
			if err != nil || secs <= 0 {
				return Spec{}, fmt.Errorf("--gpu %q: replay:FILE@T needs T in Unix seconds", spec)
			}
			return Spec{Kind: KindReplay, Path: arg[:i], Start: time.Unix(0, int64(secs*1e9))}, nil
		}
		return Spec{Kind: KindReplay, Path: arg}, nil
	}
	return Spec{}, fmt.Errorf("--gpu %q: unknown backend %q (%s)", spec, kind, Usage)
}

// newNVML returns the NVML library handle; tests replace it with a mock.
var newNVML = func() nvml.Interface { return nvml.New() }

// Options are what opening a backend needs besides the spec.
type Options struct {
	Logger *slog.Logger
	// SysfsRoot and ProcfsRoot are where the amd backend (and auto's look
	// for AMD and NVIDIA cards) reads sysfs and procfs; default /sys, /proc.
	SysfsRoot  string
	ProcfsRoot string
}

// OpenWith parses spec and opens the backend it names.
func OpenWith(spec string, o Options) (gpu.Backend, error) {
	sp, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	logger := cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	switch sp.Kind {
	case KindSim:
		logger.Info("gpu backend: simulated GPUs", "n", sp.N, "seed", sp.Seed)
		return simgpu.New(sp.N, sp.Seed), nil
	case KindReplay:
		b, err := replay.Open(sp.Path)
		if err != nil {
			return nil, err
		}
		if !sp.Start.IsZero() {
			b.StartAt(sp.Start)
		}
		logger.Info("gpu backend: replay", "file", sp.Path, "gpus", len(b.Devices()), "duration", b.Duration(), "anchored_at", sp.Start)
		return b, nil
	case KindNVML:
		return openNVML(logger)
	case KindAMD:
		return openAMD(o, logger)
	default: // auto
		b, err := openNVML(logger)
		if err == nil {
			return b, nil
		}
		sysfs := cmp.Or(o.SysfsRoot, "/sys")
		cards, _ := amdgpu.FindCards(sysfs)
		switch {
		case len(cards) > 0 && !amdgpu.HasNVIDIA(sysfs):
			logger.Info("gpu backend: auto found no NVIDIA GPU and picked amd", "amd_cards", len(cards), "nvml", err.Error())
			return openAMD(o, logger)
		case len(cards) > 0:
			return nil, fmt.Errorf("--gpu auto: this node has NVIDIA and AMD GPUs and NVML does not work (%w); fix the NVIDIA driver, or measure the AMD GPUs alone with --gpu amd", err)
		}
		if !strings.Contains(err.Error(), "--gpu sim:2") {
			err = fmt.Errorf("%w; to run without a GPU use --gpu sim:2", err)
		}
		return nil, fmt.Errorf("--gpu auto: no usable NVIDIA GPU and no AMD GPU: %w", err)
	}
}

func openAMD(o Options, logger *slog.Logger) (gpu.Backend, error) {
	opt := amdgpu.Options{SysfsRoot: o.SysfsRoot, ProcfsRoot: o.ProcfsRoot, Logger: logger}
	if lib, err := amdsmi.Open(""); err == nil {
		logger.Info("amd-smi: loaded; cards it knows take their energy counter from it", "lib", lib.Path(), "gpus", lib.GPUs())
		opt.SMI = lib
	} else {
		logger.Info("amd-smi: not loaded; energy from the amdgpu sysfs files alone", "err", err.Error())
	}
	b, err := amdgpu.New(opt)
	if err != nil {
		if opt.SMI != nil {
			opt.SMI.(*amdsmi.Lib).Close()
		}
		return nil, err
	}
	logger.Info("gpu backend: amd", "gpus", len(b.Devices()))
	return b, nil
}

func openNVML(logger *slog.Logger) (gpu.Backend, error) {
	b, err := nvmlgpu.New(newNVML(), logger)
	if err != nil {
		return nil, err
	}
	logger.Info("gpu backend: nvml", "gpus", len(b.Devices()))
	return b, nil
}
