package cli

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/trainmeter/trainmeter/collector/internal/collectorconfig"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
)

func TestBudgetCommands(t *testing.T) {
	clk := tu.Clock()
	addr := liveCollectorWith(t, server.Config{Clock: clk, Budget: server.BudgetConfig{EvalInterval: 24 * time.Hour}}) // run-a: llama-3-8b, ended, 2 GPU-seconds at $2/h
	clk.Advance(31 * 24 * time.Hour)                                                                                   // into the month after run-a's
	env := map[string]string{EnvCollector: addr}
	out, err := run(t, env, "budget")
	if err != nil || !strings.Contains(out, "no budgets") {
		t.Fatalf("budget: %q %v", out, err)
	}
	if _, err := run(t, env, "budget", "set", "x", "lots"); err == nil || !strings.Contains(err.Error(), "not a number") {
		t.Errorf("non-numeric amount: %v", err)
	}
	if _, err := run(t, env, "budget", "set", "x", "--", "-1"); err == nil || !strings.Contains(err.Error(), "above 0") {
		t.Errorf("negative amount: %v", err)
	}
	if _, err := run(t, env, "budget", "set", "x", "1", "--period", "week"); err == nil || !strings.Contains(err.Error(), "total or month") {
		t.Errorf("bad period: %v", err)
	}
	// A monthly budget counts the runs started this month: run-a is older.
	if _, err := run(t, env, "budget", "set", "model:llama-3-8b", "5", "--period", "month"); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, env, "budget", "set", "model:llama-3-8b", "$0.001")
	if err != nil || !strings.Contains(out, "budget model:llama-3-8b: $0.00100 in total, policy alert") {
		t.Fatalf("budget set: %q %v", out, err)
	}
	out, err = run(t, env, "budget")
	if err != nil || !regexp.MustCompile(`model:llama-3-8b +total +\$0.00100 +\$0.00111 +111%`).MatchString(out) || !regexp.MustCompile(`\d{4}-\d{2} +\$5.00 +\$0.00 +0%`).MatchString(out) {
		t.Errorf("budget table:\n%s %v", out, err)
	}
	// The collector's loop evaluates once a day of its clock.
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err = run(t, env, "alerts", "--kind", "budget")
		if err == nil && strings.Count(out, "budget model:llama-3-8b") == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts:\n%s %v", out, err)
		}
		clk.Advance(24 * time.Hour)
		time.Sleep(100 * time.Millisecond)
	}
	// The alerts round as `budget` does (issue 15: "spent $0.00 of $0.00
	// (123%)").
	if !strings.Contains(out, "spent $0.00111 of $0.00100 (111%)") {
		t.Errorf("alerts do not show the amounts as `budget` does:\n%s", out)
	}
	out, err = run(t, env, "forecast", "llama-3-8b", "3", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		MeanRunUsd         float64  `json:"mean_run_usd"`
		ExpectedUsd        float64  `json:"expected_usd"`
		BudgetUsd          *float64 `json:"budget_usd"`
		OverageProbability float64  `json:"overage_probability"`
	}
	if err := json.Unmarshal([]byte(out), &f); err != nil {
		t.Fatal(err)
	}
	if f.MeanRunUsd <= 0 || f.ExpectedUsd != 3*f.MeanRunUsd || f.BudgetUsd == nil || f.OverageProbability != 1 {
		t.Errorf("forecast %s", out)
	}
	if _, err := run(t, env, "forecast", "tiny", "3"); err == nil || !strings.Contains(err.Error(), "no ended runs") {
		t.Errorf("forecast of a model with no ended run: %v", err)
	}
	if _, err := run(t, env, "forecast", "llama-3-8b", "0"); err == nil {
		t.Error("forecast of 0 runs accepted")
	}
	if out, err := run(t, env, "budget", "delete", "model:llama-3-8b", "--period", "month"); err != nil || !strings.Contains(out, "deleted") {
		t.Errorf("delete: %q %v", out, err)
	}
	if _, err := run(t, env, "budget", "delete", "model:llama-3-8b", "--period", "month"); err == nil || !strings.Contains(err.Error(), "no such budget") {
		t.Errorf("second delete: %v", err)
	}
	if out, err := run(t, env, "prices"); err != nil || !strings.Contains(out, "no prices: the collector has no price provider") {
		t.Errorf("prices without a provider: %q %v", out, err)
	}
	if _, err := run(t, env, "prices", "fetch"); err == nil || !strings.Contains(err.Error(), "no price provider") {
		t.Errorf("prices fetch without a provider: %v", err)
	}
	// A price list imported through the CLI needs no provider.
	out, err = run(t, env, "prices", "import", "../pricing/prices/testdata/price_list.csv")
	if err != nil || !strings.Contains(out, "imported 3 offers of 2 GPU models, 0 price alerts") {
		t.Fatalf("prices import: %q %v", out, err)
	}
	out, err = run(t, env, "prices", "--gpu", "rtx_4090")
	if err != nil || !regexp.MustCompile(`RTX 4090 +0\.380 +lambda +0\.410 +2 +- +0 `).MatchString(out) || !strings.Contains(out, "recommended RTX 4090 offers") {
		t.Errorf("prices --gpu rtx_4090:\n%s %v", out, err)
	}
	// --provider narrows the catalog to one provider's offers: the list
	// names lambda, runpod and coreweave.
	out, err = run(t, env, "prices", "--provider", "runpod")
	if err != nil || !regexp.MustCompile(`RTX 4090 +0\.440 +runpod +0\.440 +1 `).MatchString(out) || strings.Contains(out, "H100") ||
		!regexp.MustCompile(`(?m)^runpod +1 +0 +\S+ +[0-9.]+s +imported$`).MatchString(out) {
		t.Errorf("prices --provider runpod:\n%s %v", out, err)
	}
	if _, err := run(t, env, "prices", "--provider", "vastai"); err == nil || !strings.Contains(err.Error(), "providers with offers: coreweave, lambda, runpod") {
		t.Errorf("prices --provider vastai without its offers: %v", err)
	}
	bad := t.TempDir() + "/bad.csv"
	if err := os.WriteFile(bad, []byte("gpu_name,dph_total\nA100,free\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, env, "prices", "import", bad); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad price list: %v", err)
	}
}

func TestServeBudgetFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--price-provider", "aws"},
		{"--price-provider", "file"},
		{"--webhook", "ftp://example.com/x"},
		{"--budget-timezone", "Mars/Olympus"},
		{"--price-fetch-interval", "-1h"},
		{"--price-max-age", "-1h"},
		{"--price-max-age", "30m"}, // shorter than the hourly fetch
		{"--vastai-key-file", "/nonexistent/key"},
		{"--webhook-retries", "-1"},
		{"--price-provider", "vastai,lambda"}, // no Lambda key
		{"--price-provider", "runpod"},        // no RunPod key
		{"--price-provider", "lambda", "--lambda-key-file", "/nonexistent/key"},
		{"--price-provider", "vastai,vastai"},
	} {
		if _, err := run(t, nil, append([]string{"serve", "--data", t.TempDir()}, args...)...); err == nil {
			t.Errorf("serve %v accepted", args)
		}
	}
}

// TestWebhookURLFile: --webhook-url-file reads webhook URLs (one a line,
// blank lines and # comments skipped) so a URL with a secret in it is not
// on the command line; they join --webhook's. A missing file, or one with a
// URL that is not http(s), refuses the start.
func TestWebhookURLFile(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/webhook.url"
	if err := os.WriteFile(file, []byte("# Slack\nhttps://hooks.example/services/T0/B0/s3cret\n\nhttps://alice:pw@alerts.example/in\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := collectorconfig.Default()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	collectorconfig.BindFlags(fs, &conf)
	if err := fs.Parse([]string{"--webhook", "https://plain.example/x", "--webhook-url-file", file}); err != nil {
		t.Fatalf("%v (want --webhook-url-file)", err)
	}
	cfg, err := conf.ServerConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"https://plain.example/x", "https://hooks.example/services/T0/B0/s3cret", "https://alice:pw@alerts.example/in"}
	if !slices.Equal(cfg.Alerts.Webhook.URLs, want) {
		t.Errorf("webhook URLs %q, want %q", cfg.Alerts.Webhook.URLs, want)
	}
	ftp := dir + "/ftp.url"
	if err := os.WriteFile(ftp, []byte("ftp://example.com/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{dir + "/missing", ftp} {
		if _, err := run(t, nil, "serve", "--data", t.TempDir(), "--webhook-url-file", f); err == nil {
			t.Errorf("serve --webhook-url-file %s accepted", f)
		}
	}
}
