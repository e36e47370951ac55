package agentconfig

import (
	"fmt"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
)

// DefaultSpoolDir is where the agent keeps unacked batches by default.
const DefaultSpoolDir = "/var/lib/trainmeter/spool"

// DefaultSpoolMaxBytes bounds the spool by default: 1 GiB, about 8 days of
// collector outage for an 8-GPU node (see spool.DefaultMaxBytes).
const DefaultSpoolMaxBytes = spool.DefaultMaxBytes

func (c *Config) validateSpool() []error {
	var errs []error
	if c.Spool == "" {
		errs = append(errs, fmt.Errorf("spool directory is empty"))
	}
	if c.SpoolMaxBytes < spool.MinMaxBytes {
		errs = append(errs, fmt.Errorf("spool_max_bytes %d: want at least %d", c.SpoolMaxBytes, spool.MinMaxBytes))
	}
	return errs
}
