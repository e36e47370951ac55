package agentconfig

// Several collectors: `collector: A,B`, a YAML list, or --collector A,B.
// collector_mode says what the list is: "all" (a pair, or more: every batch
// goes to each, each with its own spool cursor) or "any" (replicas on one
// database: each batch goes to one of them, the next when one fails; one
// spool cursor serves the list). docs/deploy.md.

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/pkg/collectoraddr"
)

// Collectors are the collector addresses, in the order given. Empty items
// (a trailing comma) are kept, so that Validate names them.
func (c *Config) Collectors() []string {
	parts := strings.Split(c.Collector, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

// Collector modes (collector_mode, --collector-mode).
const (
	// ModeAll sends every batch to each collector listed.
	ModeAll = "all"
	// ModeAny sends each batch to one of the collectors listed.
	ModeAny = "any"
)

// AnyCollector reports whether each batch goes to one of the collectors
// (collector_mode: any) rather than to each.
func (c *Config) AnyCollector() bool { return c.CollectorMode == ModeAny }

// AnyOrder is, in mode any, the collectors in the order the agent tries
// them: from one picked by the node's name, so that agents given the same
// list spread over the replicas, then the rest in turn.
func (c *Config) AnyOrder() []string {
	addrs := c.Collectors()
	h := fnv.New32a()
	h.Write([]byte(c.Node))
	first := int(h.Sum32() % uint32(len(addrs)))
	return slices.Concat(addrs[first:], addrs[:first])
}

// SpoolCursors names the spool's cursors: one per collector in mode all,
// one for the whole list in mode any (named "any", so that a replica added
// to or taken from the list keeps the acks).
func (c *Config) SpoolCursors() []string {
	if c.AnyCollector() {
		return []string{ModeAny}
	}
	return c.Collectors()
}

func (c *Config) validateCollectors() []error {
	addrs := c.Collectors()
	var errs []error
	switch c.CollectorMode {
	case ModeAll, ModeAny:
	default:
		errs = append(errs, fmt.Errorf("collector_mode %q: want all (every batch to each collector) or any (each batch to one of them)", c.CollectorMode))
	}
	if len(addrs) == 1 {
		if err := collectoraddr.Check(addrs[0]); err != nil {
			errs = append(errs, err)
		}
		return errs
	}
	// Each collector of "all" has a spool cursor; "any" has one for the list.
	if len(addrs) > spool.MaxCollectors && !c.AnyCollector() {
		errs = append(errs, fmt.Errorf("collector: %d addresses; at most %d (a pair is what docs/deploy.md recommends)", len(addrs), spool.MaxCollectors))
	}
	for i, a := range addrs {
		if a == "" {
			errs = append(errs, fmt.Errorf("collector %q: address %d of %d is empty: give HOST:PORT,HOST:PORT", c.Collector, i+1, len(addrs)))
			continue
		}
		if err := collectoraddr.Check(a); err != nil {
			errs = append(errs, err)
		}
		if slices.Contains(addrs[:i], a) {
			errs = append(errs, fmt.Errorf("collector %q is listed twice: list each collector once", a))
		}
	}
	return errs
}

// collectorListAsString turns a YAML list under `collector:` into the
// comma-separated string the field holds, so the file can say either.
func collectorListAsString(data []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return data, nil // the strict decode reports it
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return data, nil
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "collector" || v.Kind != yaml.SequenceNode {
			continue
		}
		var addrs []string
		for _, item := range v.Content {
			if item.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: collector: each item must be an address HOST:PORT", item.Line)
			}
			addrs = append(addrs, item.Value)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("line %d: collector: the list is empty", v.Line)
		}
		root.Content[i+1] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: strings.Join(addrs, ",")}
		return yaml.Marshal(&doc)
	}
	return data, nil
}
