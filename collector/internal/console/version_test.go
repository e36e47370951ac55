package console_test

import (
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/console"
)

// TestVersionInFooterAndAssetURLs: a version with a '+' (build metadata, as
// `make build` gives) is shown as it is in the footer, and each asset URL's
// v parameter decodes to it (encoded once, not twice).
func TestVersionInFooterAndAssetURLs(t *testing.T) {
	const v = "0.1.0+abc123def456"
	defer console.SetVersion(func() string { return v })()
	c := startCollector(t, nil)
	_, body := get(t, nil, c.base+"/runs")
	footer := regexp.MustCompile(`<footer>([^<]*)</footer>`).FindStringSubmatch(body)
	if footer == nil {
		t.Fatal("no footer")
	}
	if text := html.UnescapeString(footer[1]); !strings.HasPrefix(text, "trainmeter "+v+" ·") {
		t.Errorf("footer reads %q, want it to show %q", text, v)
	}
	refs := regexp.MustCompile(`(?:href|src)="(/static/[^"]+)"`).FindAllStringSubmatch(body, -1)
	if len(refs) == 0 {
		t.Fatal("no asset URLs in the page")
	}
	for _, m := range refs {
		u, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
		if err != nil {
			t.Fatal(err)
		}
		if got := u.Query().Get("v"); got != v {
			t.Errorf("asset %s: v=%q, want %q", m[1], got, v)
		}
	}
}
