package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestNoFlagUsageHasBackquotes: pflag takes a backquoted word in a flag's
// usage for the name of its value, which --help then shows after the flag.
func TestNoFlagUsageHasBackquotes(t *testing.T) {
	newRootCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if strings.Contains(f.Usage, "`") {
			t.Errorf("--%s: usage %q has a backquote", f.Name, f.Usage)
		}
	})
}
