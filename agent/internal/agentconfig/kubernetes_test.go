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

	cfg.Kubernetes = KubernetesConfig{} // off
	if err := cfg.Validate(); err != nil {
		t.Errorf("empty section refused: %v", err)
	}
}
