package agentconfig

import (
	"errors"
	"fmt"
	"net/url"
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
	// APIServer is the API server's https URL the pods' labels, UIDs and
	// owners are read from, with TokenFile's bearer token and CAFile's
	// CA. Empty: the in-cluster service account's (an agent in a pod, as
	// the DaemonSet runs it). Set it for an agent run outside a pod.
	APIServer string `yaml:"api_server"`
	TokenFile string `yaml:"token_file"`
	CAFile    string `yaml:"ca_file"`
}

// API is where the pods are read from: the configured API server, else the
// in-cluster one; ok false (and why) when neither.
func (k KubernetesConfig) API() (cfg podresources.APIConfig, ok bool, why string) {
	if k.APIServer == "" {
		return podresources.InClusterConfig()
	}
	return podresources.APIConfig{Server: k.APIServer, TokenFile: k.TokenFile, CAFile: k.CAFile}, true, ""
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
	if k.APIServer != "" {
		if u, err := url.Parse(k.APIServer); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, fmt.Errorf("kubernetes.api_server %q: want https://HOST:PORT", k.APIServer))
		}
		if !filepath.IsAbs(k.TokenFile) || !filepath.IsAbs(k.CAFile) {
			errs = append(errs, fmt.Errorf("kubernetes.api_server is set: token_file and ca_file want absolute paths (got %q, %q)", k.TokenFile, k.CAFile))
		}
	} else if k.TokenFile != "" || k.CAFile != "" {
		errs = append(errs, errors.New("kubernetes.token_file and ca_file go with api_server (without it, the in-cluster service account's are used)"))
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
