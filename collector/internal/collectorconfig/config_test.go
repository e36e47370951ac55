package collectorconfig_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"github.com/trainmeter/trainmeter/collector/internal/collectorconfig"
	"github.com/trainmeter/trainmeter/collector/internal/server"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "collector.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// resolve parses args as serve's flags over the file at path.
func resolve(t *testing.T, path string, args ...string) (collectorconfig.Config, error) {
	t.Helper()
	c := collectorconfig.Default()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	otel := collectorconfig.BindFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	err := collectorconfig.Resolve(fs, path, &c)
	if err == nil {
		err = otel.Apply()
	}
	return c, err
}

// An unknown key (a typo) is refused, naming the file, the line, the key
// and its section; every unknown key at once.
func TestUnknownKeyIsRefusedByName(t *testing.T) {
	p := write(t, "server:\n  listen: 127.0.0.1:1\nstore:\n  data: /x\n  retention: 720h\ncomsole: {}\n")
	_, err := resolve(t, p)
	if err == nil {
		t.Fatal("unknown keys accepted")
	}
	for _, want := range []string{p + ":5: unknown key \"retention\" in section store", p + ":6: unknown key \"comsole\" at the top level"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// The file sets keys; a flag given on the command line wins over its key;
// a flag not given leaves the file's value (not its own default); a
// repeatable flag replaces the file's map.
func TestFlagsOverrideTheFile(t *testing.T) {
	p := write(t, `server: {listen: "0.0.0.0:7433", log_level: debug}
store: {data: /srv/data, commit_window: 50ms}
pricing: {gpu_price_per_hour: 2.5, node_gpu_price: {a: 1, b: 2}}
prices: {providers: [vastai, azure]}
otel: {endpoint: "otel:4317", headers: {x: "1"}, prometheus_run_metrics: true}
console: {listen: ""}
`)
	c, err := resolve(t, p, "--listen", "127.0.0.1:9", "--node-gpu-price", "c=3", "--price-provider", "file", "--otlp-header", "y=2", "--gc-interval", "1m")
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.Listen != "127.0.0.1:9" || c.Store.GCInterval != time.Minute {
		t.Errorf("flags given did not win: listen %q gc %v", c.Server.Listen, c.Store.GCInterval)
	}
	if c.Server.LogLevel != "debug" || c.Store.Data != "/srv/data" || c.Store.CommitWindow == nil || *c.Store.CommitWindow != 50*time.Millisecond ||
		c.Pricing.GPUPricePerHour != 2.5 || c.Console.Listen != "" || !c.OTel.PrometheusRunMetrics {
		t.Errorf("a flag not given overrode the file: %+v", c)
	}
	if !reflect.DeepEqual(c.Pricing.NodeGPUPrice, map[string]float64{"c": 3}) || !slices.Equal(c.Prices.Providers, []string{"file"}) {
		t.Errorf("repeatable flags must replace the file's: %v %v", c.Pricing.NodeGPUPrice, c.Prices.Providers)
	}
	if !reflect.DeepEqual(c.OTel.Headers, map[string]string{"x": "1", "y": "2"}) {
		t.Errorf("otel headers %v: --otlp-header joins the file's", c.OTel.Headers)
	}
	// Without a file the flags' defaults are Default().
	if c, _ := resolve(t, ""); !reflect.DeepEqual(c, collectorconfig.Default()) {
		t.Errorf("no file, no flags: %+v, want the defaults", c)
	}
}

// Every section's problems are reported at once, each naming its section.
func TestCheckReportsEverySection(t *testing.T) {
	p := write(t, `server: {log_level: loud}
store: {commit_window: 5s}
carbon: {api_token_file: /x}
alerts: {webhook_retries: -1}
pricing: {tariff: /nonexistent/tariff.yaml}
`)
	c, err := resolve(t, p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Check(func(string) string { return "" })
	for _, want := range []string{"server: log level", "store: commit_window", "carbon: api_token_file", "alerts: webhook_retries", "pricing.tariff (--tariff)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check: %v, want %q", err, want)
		}
	}
}

// The shipped collector.yaml is valid, and it is the defaults but for
// what it says it changes (the data directory and the health address).
func TestShippedCollectorYAML(t *testing.T) {
	c, err := resolve(t, "../../../deploy/etc/trainmeter/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	want := collectorconfig.Default()
	want.Store.Data, want.Server.StatusListen = "/var/lib/trainmeter/data", "127.0.0.1:9465"
	if !reflect.DeepEqual(c, want) {
		t.Errorf("shipped config %+v\nwant %+v", c, want)
	}
}

// docs/config.md names every key (section.key) and every flag of serve.
func TestConfigDocListsEveryKeyAndFlag(t *testing.T) {
	b, err := os.ReadFile("../../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var walk func(prefix string, t reflect.Type, out *[]string)
	walk = func(prefix string, typ reflect.Type, out *[]string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			switch {
			case tag == "-":
			case tag == "" && strings.Contains(f.Tag.Get("yaml"), "inline"):
				walk(prefix, f.Type, out)
			case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)):
				walk(tag+".", f.Type, out)
			default:
				*out = append(*out, prefix+tag)
			}
		}
	}
	var keys []string
	walk("", reflect.TypeOf(collectorconfig.Config{}), &keys)
	if len(keys) < 55 {
		t.Fatalf("only %d keys found: the walk misses sections", len(keys))
	}
	for _, k := range keys {
		if !strings.Contains(doc, "`"+k+"`") {
			t.Errorf("docs/config.md does not list `%s`", k)
		}
	}
	c := collectorconfig.Default()
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	collectorconfig.BindFlags(fs, &c)
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(doc, "`--"+f.Name+"`") {
			t.Errorf("docs/config.md does not name the flag `--%s`", f.Name)
		}
	})
}

// The Kubernetes ConfigMap's collector.yaml passes the same check.
func TestKubernetesCollectorYAML(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/kubernetes/collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Kind string
		Data map[string]string
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if err := yaml.Unmarshal([]byte(doc), &cm); err == nil && cm.Kind == "ConfigMap" {
			break
		}
	}
	c, err := resolve(t, write(t, cm.Data["collector.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(func(string) string { return "" }); err != nil || c.Store.Data != "/var/lib/trainmeter/data" {
		t.Fatalf("ConfigMap collector.yaml: %v (data %q)", err, c.Store.Data)
	}
}

// commit_window unset is the store's default; set, it is what it says on
// either store (0: commit at once).
func TestCommitWindowDefaultsByStore(t *testing.T) {
	zero := time.Duration(0)
	for _, c := range []struct {
		url  string
		set  *time.Duration
		want time.Duration
	}{
		{"", nil, server.DefaultCommitWindow},
		{"postgres://u@h/db", nil, server.DefaultPostgresCommitWindow},
		{"postgres://u@h/db", &zero, 0},
		{"", &zero, 0},
	} {
		cfg := collectorconfig.Default()
		cfg.Store.URL, cfg.Store.CommitWindow = c.url, c.set
		sc, err := cfg.ServerConfig(func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if sc.CommitWindow != c.want {
			t.Errorf("store %q, commit_window %v: %v, want %v", c.url, c.set, sc.CommitWindow, c.want)
		}
	}
}
