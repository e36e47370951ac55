package trainerproto

import (
	"strings"
	"testing"
)

func TestTokenCountsAreCapped(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{`{"event":"step","run_id":"r","tokens":4294967297}`, "step: tokens too large: 4294967297 > 4294967296 per step"},
		{`{"event":"step","run_id":"r","tokens":18446744073709551615}`, "step: tokens too large"},
		{`{"event":"step","run_id":"r","tokens":1,"tokens_total":1125899906842625}`, "step: tokens_total too large"},
	} {
		if _, err := Parse([]byte(tc.line)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.line, err, tc.want)
		}
	}
	ev, err := Parse([]byte(`{"event":"step","run_id":"r","tokens":4294967296,"tokens_total":1125899906842624}`))
	if err != nil {
		t.Fatalf("the largest allowed counts were refused: %v", err)
	}
	if s := ev.(*Step); s.Tokens != MaxStepTokens || *s.TokensTotal != MaxTokensTotal {
		t.Errorf("parsed %+v", s)
	}
}
