package agent

import (
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
)

// DefaultConfig is the agent's default configuration, for the tests.
func DefaultConfig() agentconfig.Config { return agentconfig.DefaultConfig() }

func TestSpoolConfigValidated(t *testing.T) {
	c := DefaultConfig()
	if c.Spool != agentconfig.DefaultSpoolDir || c.SpoolMaxBytes != agentconfig.DefaultSpoolMaxBytes {
		t.Errorf("defaults %q %d", c.Spool, c.SpoolMaxBytes)
	}
	c.Spool = ""
	c.SpoolMaxBytes = 10
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "spool directory is empty") || !strings.Contains(err.Error(), "spool_max_bytes 10") {
		t.Errorf("bad spool settings: %v", err)
	}
}
