package aggregate

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	storev1 "github.com/trainmeter/trainmeter/proto/trainmeter/store/v1"
)

// The store rewrites a run's aggregate at every commit that touches the run
// and decodes it for every listing, so it is stored as its protobuf
// (storev1.Aggregate), which State embeds: there is nothing to copy.

// Marshal encodes the state, node states included.
func (s *State) Marshal() ([]byte, error) { return proto.Marshal(s.Aggregate) }

// The store keeps a run's node states apart from the rest of its aggregate,
// each under a key of its own, and writes at each commit only the nodes it
// changed: with a thousand nodes in one run, rewriting every node's state
// (~0.9 KB each, mostly open peak buckets) at every commit bounded the
// collector (docs/benchmarks.md).

// MarshalApart encodes the state without its node states, and marks it
// stored apart (Aggregate.nodes_apart); MarshalNode encodes those, and a
// state read back with Unmarshal gets them from UnmarshalNode.
func (s *State) MarshalApart() ([]byte, error) {
	if !s.NodesApart {
		// Stored with its nodes inside until now: every node is to be
		// written apart, changed or not.
		for name := range s.Nodes {
			s.markChanged(name)
		}
		s.NodesApart = true
	}
	nodes := s.Nodes
	s.Nodes = nil
	defer func() { s.Nodes = nodes }()
	return proto.Marshal(s.Aggregate)
}

// MarshalNode encodes one node's state.
func (s *State) MarshalNode(name string) ([]byte, error) {
	n := s.Nodes[name]
	if n == nil {
		return nil, fmt.Errorf("aggregate: run %q has no node %q", s.RunId, name)
	}
	return proto.Marshal(n)
}

// UnmarshalNode adds a node's state written by MarshalNode.
func (s *State) UnmarshalNode(name string, b []byte) error {
	n := &NodeState{}
	if err := proto.Unmarshal(b, n); err != nil {
		return fmt.Errorf("aggregate: decode node %q: %w", name, err)
	}
	s.Nodes[name] = n
	return nil
}

// TakeChangedNodes returns, sorted, the nodes whose state changed since the
// last call, and forgets them. A state decoded with its nodes inside
// (Marshal) counts every node as changed, so that the first MarshalApart
// of it is followed by all of them.
func (s *State) TakeChangedNodes() []string {
	names := make([]string, 0, len(s.changed))
	for name := range s.changed {
		if s.Nodes[name] != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	clear(s.changed)
	return names
}

// ForgetChangedNodes forgets which nodes changed, for a state stored with
// its nodes inside (Marshal).
func (s *State) ForgetChangedNodes() { clear(s.changed) }

func (s *State) markChanged(name string) {
	if s.changed == nil {
		s.changed = map[string]struct{}{}
	}
	s.changed[name] = struct{}{}
}

// Unmarshal decodes a State written by Marshal or MarshalApart.
func Unmarshal(b []byte) (*State, error) {
	s := &State{Aggregate: &storev1.Aggregate{}}
	if err := proto.Unmarshal(b, s.Aggregate); err != nil {
		return nil, fmt.Errorf("aggregate: decode: %w", err)
	}
	if s.Nodes == nil {
		s.Nodes = map[string]*NodeState{}
	}
	if !s.NodesApart {
		for name := range s.Nodes {
			s.markChanged(name)
		}
	}
	return s, nil
}
