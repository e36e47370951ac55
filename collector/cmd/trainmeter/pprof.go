//go:build pprof

package main

// Profiling build (go build -tags pprof): serves net/http/pprof on
// $TRAINMETER_PPROF_LISTEN so a collector under trainmeter-loadgen load can be
// profiled (docs/benchmarks.md). Never in the shipped binary.

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("TRAINMETER_PPROF_LISTEN"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
