package agentconfig

import (
	"errors"
	"fmt"
)

// Source switches of the `attribution:` section.
const (
	SourceAuto = "auto" // used where detected (docs/attribution.md)
	SourceOff  = "off"  // never used
)

// AttributionConfig is the `attribution:` section: which owners the GPU
// processes that no run owns may be billed to (docs/attribution.md). Each
// is auto (used where detected) or off. A process whose owner sources are
// all off leaves its GPU time idle.
type AttributionConfig struct {
	// Processes: the Linux user's process group, when no run, job or pod
	// owns a process.
	Processes string `yaml:"processes"`
	// Slurm: the Slurm job of a process, and the GPUs a job was allocated,
	// on a node where slurmd runs.
	Slurm string `yaml:"slurm"`
	// Kubernetes: the pod holding a process's GPU, and the GPUs pods hold,
	// where the kubelet's pod-resources API answers.
	Kubernetes string `yaml:"kubernetes"`
}

// DefaultAttribution: every source auto.
func DefaultAttribution() AttributionConfig {
	return AttributionConfig{Processes: SourceAuto, Slurm: SourceAuto, Kubernetes: SourceAuto}
}

// Off reports whether a source's switch is off.
func Off(v string) bool { return v == SourceOff }

// Validate reports every problem with the section.
func (a AttributionConfig) Validate() error {
	var errs []error
	for _, f := range []struct{ key, v string }{{"processes", a.Processes}, {"slurm", a.Slurm}, {"kubernetes", a.Kubernetes}} {
		if f.v != SourceAuto && f.v != SourceOff {
			errs = append(errs, fmt.Errorf("attribution.%s %q: want auto or off", f.key, f.v))
		}
	}
	return errors.Join(errs...)
}
