package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Bad carbon flags stop serve with a message naming the flag, the file or
// the zone.
func TestServeCarbonFlagsAreValidated(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "carbon.yaml")
	if err := os.WriteFile(good, []byte("zones:\n  DE: {default: 380}\n  FR: {default: 50}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("zones:\n  DE: {default: 380, rules: [{from: \"10:00\", to: \"11:00\", gco2_kwh: -3}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--carbon-file", "/nonexistent.yaml"}, "--carbon-file"},
		{[]string{"--carbon-file", bad}, "zone DE: rule 1: gco2_kwh must be a finite number >= 0"},
		{[]string{"--carbon-file", good, "--carbon-node-zone", "gpu-1"}, "--carbon-node-zone \"gpu-1\": want NODE=ZONE"},
		{[]string{"--carbon-file", good, "--carbon-zone", "PL"}, `default carbon zone "PL" is not in the carbon file (zones: DE, FR)`},
		{[]string{"--carbon-zone", "DE"}, "no carbon source"},
		{[]string{"--carbon-api", "ftp://example.org", "--carbon-zone", "DE"}, "want an http(s) URL"},
		{[]string{"--carbon-api", "https://api.electricitymap.org"}, "no zone to ask for"},
		{[]string{"--carbon-api", "https://api.electricitymap.org", "--carbon-zone", "DE", "--carbon-fetch-interval", "1s"}, "at least 1m"},
		{[]string{"--carbon-api-token-file", "/nonexistent"}, "--carbon-api-token-file"},
	} {
		_, err := run(t, nil, append([]string{"serve", "--listen", "127.0.0.1:0", "--data", t.TempDir()}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
