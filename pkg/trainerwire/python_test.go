package trainerwire

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// The Python client's typed keywords (METADATA_KEYS) plus the keys it fills
// itself (PROTOCOL_KEYS) are exactly the keys run_start reads: a field added
// to the proto without a keyword, or a keyword the agent would take for a
// label, fails here.
func TestPythonClientTakesEveryRunStartKey(t *testing.T) {
	src, err := os.ReadFile("../../clients/python/trainmeter/metadata.py")
	if err != nil {
		t.Fatal(err)
	}
	var py []string
	for _, name := range []string{"METADATA_KEYS", "PROTOCOL_KEYS"} {
		m := regexp.MustCompile(`(?s)\n` + name + ` = \((.*?)\)`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("metadata.py has no %s tuple", name)
		}
		for _, k := range regexp.MustCompile(`"(\w+)"`).FindAllSubmatch(m[1], -1) {
			py = append(py, string(k[1]))
		}
	}
	slices.Sort(py)
	if got, want := py, RunStartKeys(); !slices.Equal(got, want) {
		t.Errorf("Python client keys\n got %q\nwant %q", got, want)
	}
}
