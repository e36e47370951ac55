package agent

import "github.com/trainmeter/trainmeter/agent/internal/agentconfig"

// The agent's configuration lives in package agentconfig, so that what
// only reads it (doctor, the flag and file loading) does not import the
// agent's wiring. These names keep the agent's own API unchanged.
type Config = agentconfig.Config

const (
	DefaultWarmupSteps   = agentconfig.DefaultWarmupSteps
	DefaultSpoolDir      = agentconfig.DefaultSpoolDir
	DefaultSpoolMaxBytes = agentconfig.DefaultSpoolMaxBytes
)

// DefaultConfig returns the defaults (agentconfig.DefaultConfig).
func DefaultConfig() Config { return agentconfig.DefaultConfig() }

// LoadConfigFile reads a YAML config over cfg (agentconfig.LoadConfigFile).
func LoadConfigFile(path string, cfg *Config) error { return agentconfig.LoadConfigFile(path, cfg) }
