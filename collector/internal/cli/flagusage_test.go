package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestNoFlagUsageHasBackquotes: pflag takes a backquoted word in a flag's
// usage for the name of its value (`--price-fetch-interval trainmeter
// prices fetch` in --help), so no usage of any command's flag may hold one.
func TestNoFlagUsageHasBackquotes(t *testing.T) {
	var walk func(c *cobra.Command)
	seen := 0
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			seen++
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backquote (help shows --%s %s)", c.CommandPath(), f.Name, f.Usage, f.Name, func() string { n, _ := pflag.UnquoteUsage(f); return n }())
			}
		}
		c.LocalFlags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRootCommand(func(string) string { return "" }))
	if seen < 50 {
		t.Fatalf("only %d flags seen: the walk misses commands", seen)
	}
}
