package e2e

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pricesList is `trainmeter prices --json`, the parts about offer age.
type pricesList struct {
	Gpus []struct {
		GpuName  string  `json:"gpu_name"`
		Cheapest float64 `json:"cheapest_usd_per_gpu_hour"`
	} `json:"gpus"`
	Providers []struct {
		Provider string  `json:"provider"`
		Offers   int     `json:"offers"`
		Stale    bool    `json:"stale"`
		AgeS     float64 `json:"age_s"`
		Error    string  `json:"error"`
	} `json:"providers"`
	MaxOfferAgeS float64 `json:"max_offer_age_s"`
	Warning      string  `json:"warning"`
}

func (c *cluster) pricesJSON() pricesList {
	c.t.Helper()
	var l pricesList
	out := c.cli("prices", "--json")
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		c.t.Fatalf("prices --json: %v\n%s", err, out)
	}
	return l
}

func (l pricesList) stale(provider string) bool {
	for _, p := range l.Providers {
		if p.Provider == provider {
			return p.Stale
		}
	}
	return false
}

func (l pricesList) cheapest(gpu string) float64 {
	for _, g := range l.Gpus {
		if g.GpuName == gpu {
			return g.Cheapest
		}
	}
	return 0
}

// cliFails runs the CLI expecting it to fail and returns its stderr.
func (c *cluster) cliFails(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "trainmeter"), args...)
	cmd.Env = append(os.Environ(), "TRAINMETER_COLLECTOR="+c.addr)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		c.t.Fatalf("trainmeter %v: %v, want it to fail", args, err)
	}
	return stderr.String()
}

// TestStalePricesAcrossBinaries: a collector with a max offer age of 2 s
// (`serve --price-max-age`) fetches from vast.ai (a local server answering
// its API) and a price file. vast.ai's answer turns bad: once its last good
// offers are older than the max age, `trainmeter prices` (table and --json)
// lists it stale with its age and error, and its RTX 4090 is no current
// price while the file's L40S is; with both sources failing, `prices` warns
// that every catalog is stale instead of an empty answer; a successful
// fetch makes the prices current again.
func TestStalePricesAcrossBinaries(t *testing.T) {
	t.Parallel()
	vast := newFakePriceAPI(t, "vastai_offers.json", func(r *http.Request) bool { return r.Method == http.MethodGet }, false, nil)
	priceFile := filepath.Join(t.TempDir(), "prices.csv")
	writeList := func(s string) {
		if err := os.WriteFile(priceFile, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const list = "gpu_name,num_gpus,dph_total\nL40S,2,1.8\n"
	writeList(list)
	c := startCollector(t, "--price-provider", "vastai,file", "--vastai-url", vast.srv.URL, "--price-file", priceFile,
		"--price-fetch-interval", "0", "--price-max-age", "2s")
	c.cli("prices", "fetch")
	if l := c.pricesJSON(); l.cheapest("RTX 4090") != 0.35 || l.cheapest("L40S") != 0.9 || l.MaxOfferAgeS != 2 || l.stale("vastai") || l.Warning != "" {
		t.Fatalf("prices after a good fetch: %+v", l)
	}

	vast.broken.Store(true)
	c.eventually("vast.ai's catalog stale", func() bool {
		c.cli("prices", "fetch") // the file answers: only vast.ai's offers age
		return c.pricesJSON().stale("vastai")
	})
	l := c.pricesJSON()
	if l.cheapest("RTX 4090") != 0 || l.cheapest("L40S") != 0.9 || l.stale("file") || l.Warning != "" {
		t.Errorf("prices with vast.ai stale: %+v, want its RTX 4090 gone, the file's L40S current, no warning", l)
	}
	for _, p := range l.Providers {
		if p.Provider == "vastai" && (p.Offers != 6 || p.AgeS <= 2 || !strings.Contains(p.Error, "vast.ai")) {
			t.Errorf("vastai listed as %+v, want its 6 offers, older than 2 s, with the error", p)
		}
	}
	table := c.cli("prices")
	if !regexp.MustCompile(`(?m)^vastai +6 +1 +\S+ +\S+ +STALE, in no current price; failed `).MatchString(table) ||
		!strings.Contains(table, "STALE: offers older than the max offer age, 2s (serve --price-max-age)") || strings.Contains(table, "RTX 4090") {
		t.Errorf("prices with vast.ai stale:\n%s", table)
	}
	if stderr := c.cliFails("prices", "--provider", "vastai"); !strings.Contains(stderr, `the catalog of provider "vastai" is stale`) {
		t.Errorf("prices --provider vastai: %s", stderr)
	}

	// Both down: said, not an empty answer.
	writeList("gpu_name,dph_total\n")
	c.eventually("every catalog stale", func() bool {
		c.cliFails("prices", "fetch")
		return c.pricesJSON().Warning != ""
	})
	// The collector answered: its providers failed, it is not unreachable.
	if stderr := c.cliFails("prices", "fetch"); strings.Contains(stderr, "cannot reach the collector") ||
		!strings.Contains(stderr, "collector at "+c.addr+": price fetch from vastai,file: ") || !strings.Contains(stderr, "(retry later)") {
		t.Errorf("prices fetch with every provider failing: %s", stderr)
	}
	if table := c.cli("prices"); !strings.Contains(table, "warning: every price catalog is stale") || strings.Contains(table, "no prices yet") {
		t.Errorf("prices with every catalog stale:\n%s", table)
	}

	// Back: current again.
	vast.broken.Store(false)
	writeList(list)
	c.cli("prices", "fetch")
	if l := c.pricesJSON(); l.cheapest("RTX 4090") != 0.35 || l.stale("vastai") || l.stale("file") || l.Warning != "" {
		t.Errorf("prices after both came back: %+v", l)
	}
}
