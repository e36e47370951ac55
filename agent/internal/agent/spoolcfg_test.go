package agent

import (
	"strings"
	"testing"
)

func TestSpoolConfigValidated(t *testing.T) {
	c := DefaultConfig()
	if c.Spool != DefaultSpoolDir || c.SpoolMaxBytes != DefaultSpoolMaxBytes {
		t.Errorf("defaults %q %d", c.Spool, c.SpoolMaxBytes)
	}
	c.Spool = ""
	c.SpoolMaxBytes = 10
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "spool directory is empty") || !strings.Contains(err.Error(), "spool_max_bytes 10") {
		t.Errorf("bad spool settings: %v", err)
	}
}
