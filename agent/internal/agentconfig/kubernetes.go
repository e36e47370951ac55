package agentconfig

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trainmeter/trainmeter/agent/internal/podresources"
)

// KubernetesConfig is the `kubernetes:` section: where the kubelet's
// pod-resources API is, and which pod labels a pod's run carries
// (docs/kubernetes.md).
type KubernetesConfig struct {
	// PodResourcesSocket is the kubelet's pod-resources socket; pods are
	// looked up where it answers. Empty: never (a programmatic config).
	PodResourcesSocket string `yaml:"pod_resources_socket"`
	// PodLabels are the pod label keys copied onto a pod's run, read from
	// the API server with the agent's service account.
	PodLabels []string `yaml:"pod_labels"`
}

// DefaultKubernetes is the section's default: the kubelet's usual socket,
// no pod labels.
func DefaultKubernetes() KubernetesConfig {
	return KubernetesConfig{PodResourcesSocket: podresources.DefaultSocket}
}

// Validate reports every problem with the section.
func (k KubernetesConfig) Validate() error {
	var errs []error
	if k.PodResourcesSocket != "" && !filepath.IsAbs(k.PodResourcesSocket) {
		errs = append(errs, fmt.Errorf("kubernetes.pod_resources_socket %q: want an absolute path", k.PodResourcesSocket))
	}
	seen := map[string]bool{}
	for _, key := range k.PodLabels {
		switch {
		case !validLabelKey(key):
			errs = append(errs, fmt.Errorf("kubernetes.pod_labels: %q is not a Kubernetes label key ([PREFIX/]NAME, NAME of 1 to 63 letters, digits, '-', '_', '.')", key))
		case slices.Contains(podresources.Reserved, key):
			errs = append(errs, fmt.Errorf("kubernetes.pod_labels: %q is set by the agent itself (%s)", key, strings.Join(podresources.Reserved, ", ")))
		case seen[key]:
			errs = append(errs, fmt.Errorf("kubernetes.pod_labels: %q twice", key))
		}
		seen[key] = true
	}
	return errors.Join(errs...)
}

// validLabelKey: an optional DNS-subdomain prefix and '/', then a name of
// 1 to 63 characters, alphanumeric at both ends.
func validLabelKey(key string) bool {
	name := key
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		prefix := key[:i]
		name = key[i+1:]
		if prefix == "" || len(prefix) > 253 || strings.Trim(prefix, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
			return false
		}
	}
	if name == "" || len(name) > 63 || !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
