package oteltest

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// PromSample is one series of an instant query.
type PromSample struct {
	Labels map[string]string
	Value  float64
}

// parsePromJSON reads promtool's JSON rendering of an instant vector:
// [{"metric":{...},"value":[unix_ts,"value"]}, ...].
func parsePromJSON(b []byte) ([]PromSample, error) {
	var raw []struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("promtool output is not an instant vector: %v: %s", err, b)
	}
	out := make([]PromSample, 0, len(raw))
	for _, r := range raw {
		s, ok := r.Value[1].(string)
		if !ok {
			return nil, fmt.Errorf("promtool output: value %v is not a string", r.Value[1])
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("promtool output: value %q: %v", s, err)
		}
		out = append(out, PromSample{Labels: r.Metric, Value: v})
	}
	return out, nil
}
