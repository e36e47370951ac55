package cli

import (
	"slices"
	"strings"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// nodeVendors names the vendors of a node's GPUs ("amd", "amd+nvidia"),
// empty when the agent's backend names none (simulated GPUs).
func nodeVendors(gpus []*trainmeterv1.GpuInfo) string {
	var vs []string
	for _, g := range gpus {
		if v := g.GetVendor(); v != "" && !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	return strings.Join(vs, "+")
}
