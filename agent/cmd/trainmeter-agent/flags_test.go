package main

import (
	"reflect"
	"testing"

	"github.com/spf13/pflag"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
)

// TestEveryFlagIsHonouredWithConfig: each agent flag given on the command
// line beside --config changes the configuration the agent runs with (the
// config file is the base, flags win).
func TestEveryFlagIsHonouredWithConfig(t *testing.T) {
	path := writeConfig(t, "collector: 127.0.0.1:1\n")
	// Not configuration: the file itself, --check, and how long shutdown may take
	// (an option of the process, kept beside the config).
	notConfig := map[string]bool{"config": true, "check": true, "shutdown-timeout": true}
	// A value that differs from the default and parses, by flag type.
	values := map[string]string{
		"string": "flag-value", "duration": "7s", "uint64": "12345", "int64": "123456789",
		"bool": "true", "uintSlice": "4242", "int": "7", "stringArray": "x-flag=1", "stringSlice": "x-flag=1",
	}
	fileOnly := load(t, "--config", path)
	seen := 0
	newRootCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if notConfig[f.Name] {
			return
		}
		v, ok := values[f.Value.Type()]
		if !ok {
			t.Errorf("--%s: no test value for flag type %s", f.Name, f.Value.Type())
			return
		}
		if f.Name == "otlp-protocol" {
			v = "http" // validated when applied
		}
		seen++
		if got := load(t, "--config", path, "--"+f.Name+"="+v); reflect.DeepEqual(got, fileOnly) {
			t.Errorf("--%s=%s is ignored when --config is given", f.Name, v)
		}
	})
	if seen < 20 {
		t.Fatalf("only %d flags checked", seen)
	}
}

// load parses args as the agent does (config file, then the flags set on
// the command line), without validating the result.
func load(t *testing.T, args ...string) any {
	t.Helper()
	o := &options{cfg: agentconfig.DefaultConfig()}
	cmd := newRootCmdWith(o)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.load(cmd)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return cfg
}
