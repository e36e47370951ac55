package agentconfig

// A collector pair (or more): `collector: A,B`, a YAML list, or
// --collector A,B. Every batch goes to each collector (docs/deploy.md).

import (
	"fmt"
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

func (c *Config) validateCollectors() []error {
	addrs := c.Collectors()
	if len(addrs) == 1 {
		if err := collectoraddr.Check(addrs[0]); err != nil {
			return []error{err}
		}
		return nil
	}
	var errs []error
	if len(addrs) > spool.MaxCollectors {
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
			errs = append(errs, fmt.Errorf("collector %q is listed twice: a pair is two different collectors", a))
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
