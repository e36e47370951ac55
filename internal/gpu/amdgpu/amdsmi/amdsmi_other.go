//go:build !(linux && cgo)

// Package amdsmi reads AMD GPUs' energy counters through AMD SMI where it
// is installed; without cgo (or off Linux) it is never available.
package amdsmi

import "errors"

// ErrNotInstalled is Open's error here.
var ErrNotInstalled = errors.New("libamd_smi.so not loadable: agent built without cgo")

// Lib is never returned on this platform.
type Lib struct{}

// Open always fails without cgo.
func Open(string) (*Lib, error) { return nil, ErrNotInstalled }

// Path is empty.
func (*Lib) Path() string { return "" }

// GPUs is 0.
func (*Lib) GPUs() int { return 0 }

// EnergyCount never answers.
func (*Lib) EnergyCount(string) (uint64, float64, bool) { return 0, 0, false }

// Close does nothing.
func (*Lib) Close() error { return nil }
