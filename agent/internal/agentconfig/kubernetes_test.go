package agentconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestKubernetesConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(path, []byte("kubernetes:\n  pod_labels: [team, app.kubernetes.io/name]\n"), 0o600)
	cfg := DefaultConfig()
	if err := LoadConfigFile(path, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Kubernetes.PodResourcesSocket != "/var/lib/kubelet/pod-resources/kubelet.sock" ||
		!slices.Equal(cfg.Kubernetes.PodLabels, []string{"team", "app.kubernetes.io/name"}) {
		t.Errorf("read %+v", cfg.Kubernetes)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}

	cfg.Kubernetes = KubernetesConfig{PodResourcesSocket: "kubelet.sock", PodLabels: []string{"team", "team", "k8s.namespace", "bad key", "-x", "a/", "Example.com/x"}}
	err := cfg.Validate()
	for _, want := range []string{`"kubelet.sock": want an absolute path`, `"team" twice`, `"k8s.namespace" is set by the agent`,
		`"bad key" is not`, `"-x" is not`, `"a/" is not`, `"Example.com/x" is not`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}

	cfg.Kubernetes = KubernetesConfig{APIServer: "http://api:6443", TokenFile: "token"}
	err = cfg.Validate()
	for _, want := range []string{`"http://api:6443": want https://HOST:PORT`, `token_file and ca_file want absolute paths`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want %q", err, want)
		}
	}
	cfg.Kubernetes = KubernetesConfig{CAFile: "/ca.crt"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "go with api_server") {
		t.Errorf("ca_file without api_server: %v", err)
	}
	cfg.Kubernetes = KubernetesConfig{APIServer: "https://api:6443", TokenFile: "/t", CAFile: "/ca.crt"}
	if err := cfg.Validate(); err != nil {
		t.Errorf("an API server refused: %v", err)
	}
	if api, ok, _ := cfg.Kubernetes.API(); !ok || api.Server != "https://api:6443" || api.TokenFile != "/t" || api.CAFile != "/ca.crt" {
		t.Errorf("API() = %+v, %v", api, ok)
	}

	cfg.Kubernetes = KubernetesConfig{} // off
	if err := cfg.Validate(); err != nil {
		t.Errorf("empty section refused: %v", err)
	}
}
