package podresources

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// The in-cluster service account's files, as the kubelet mounts them into
// every pod that has automountServiceAccountToken.
const (
	ServiceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	ServiceAccountCA    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// ErrNoAccess: the API server refused to show the pod (401 or 403: no
// RBAC for the agent's service account).
var ErrNoAccess = errors.New("no access to pods on the API server")

// ErrPodNotFound: the API server does not know the pod (it is gone).
var ErrPodNotFound = errors.New("pod not found on the API server")

// PodMeta is what the API server says of a pod beyond its name.
type PodMeta struct {
	UID    string
	Labels map[string]string
	Owners []OwnerRef
}

// OwnerRef is one of a pod's metadata.ownerReferences.
type OwnerRef struct {
	Kind       string // Job, ReplicaSet, StatefulSet, …
	Name       string
	UID        string
	Controller bool
}

// Job is the Job that controls the pod, or nil.
func (m *PodMeta) Job() *OwnerRef {
	if m == nil {
		return nil
	}
	for i, o := range m.Owners {
		if o.Kind == "Job" && o.Controller {
			return &m.Owners[i]
		}
	}
	return nil
}

// APIReader reads pods from the Kubernetes API server with a bearer token
// (GET /api/v1/namespaces/NS/pods/NAME). It logs once that it cannot
// (no access, unreachable) and once that it can again; callers go on with
// namespace and pod alone meanwhile.
type APIReader struct {
	base      string // https://HOST:PORT
	tokenFile string
	client    *http.Client
	log       *slog.Logger

	mu     sync.Mutex
	failed bool // the last read failed for a reason other than a missing pod
}

// APIConfig says where the API server is and how to authenticate.
type APIConfig struct {
	// Server is the API server's base URL (https://HOST:PORT).
	Server string
	// TokenFile holds the bearer token; it is read at each request, as
	// the kubelet rotates projected service-account tokens.
	TokenFile string
	// CAFile is the PEM bundle that signs the API server's certificate.
	CAFile string
	// Timeout bounds one request (default 5 s).
	Timeout time.Duration
}

// InClusterConfig is the API server and service account a pod is given
// (KUBERNETES_SERVICE_HOST/PORT and the mounted token and CA); ok is false
// outside a pod.
func InClusterConfig() (cfg APIConfig, ok bool, why string) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return cfg, false, "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset): runs carry namespace and pod only"
	}
	if _, err := os.Stat(ServiceAccountToken); err != nil {
		return cfg, false, fmt.Sprintf("no service-account token (%v): set automountServiceAccountToken; runs carry namespace and pod only", err)
	}
	return APIConfig{Server: "https://" + net.JoinHostPort(host, port), TokenFile: ServiceAccountToken, CAFile: ServiceAccountCA}, true, ""
}

// NewAPIReader makes a reader; log may be nil.
func NewAPIReader(cfg APIConfig, log *slog.Logger) (*APIReader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u, err := url.Parse(cfg.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("API server %q: want https://HOST:PORT", cfg.Server)
	}
	pem, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("API server CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("API server CA %s: no PEM certificate in it", cfg.CAFile)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConns: 2, IdleConnTimeout: time.Minute}
	return &APIReader{
		base:      strings.TrimSuffix(cfg.Server, "/"),
		tokenFile: cfg.TokenFile,
		client:    &http.Client{Transport: tr, Timeout: cfg.Timeout},
		log:       log,
	}, nil
}

// Close drops idle connections.
func (r *APIReader) Close() { r.client.CloseIdleConnections() }

// Pod reads one pod's UID, labels and owners. Errors wrap ErrNoAccess
// (401/403) or ErrPodNotFound (404) where that is the cause.
func (r *APIReader) Pod(ctx context.Context, namespace, name string) (*PodMeta, error) {
	m, err := r.get(ctx, namespace, name)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil || errors.Is(err, ErrPodNotFound):
		if r.failed {
			r.log.Info("pod labels: the API server answers again")
			r.failed = false
		}
	case !r.failed:
		r.failed = true
		r.log.Warn("pod labels: cannot read pods from the API server; Kubernetes runs carry namespace, pod and container only", "err", err)
	}
	return m, err
}

func (r *APIReader) get(ctx context.Context, namespace, name string) (*PodMeta, error) {
	tok, err := os.ReadFile(r.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("service-account token: %w", err)
	}
	u := r.base + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Accept", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET pod %s/%s: %w", namespace, name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("GET pod %s/%s: %w", namespace, name, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, fmt.Errorf("GET pod %s/%s: %s: %w (grant the agent's service account get on pods: deploy/kubernetes/agent.yaml)", namespace, name, statusMessage(resp, body), ErrNoAccess)
	case http.StatusNotFound:
		return nil, fmt.Errorf("GET pod %s/%s: %w", namespace, name, ErrPodNotFound)
	default:
		return nil, fmt.Errorf("GET pod %s/%s: %s", namespace, name, statusMessage(resp, body))
	}
	var pod struct {
		Metadata struct {
			UID             string            `json:"uid"`
			Labels          map[string]string `json:"labels"`
			OwnerReferences []struct {
				Kind       string `json:"kind"`
				Name       string `json:"name"`
				UID        string `json:"uid"`
				Controller *bool  `json:"controller"`
			} `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &pod); err != nil {
		return nil, fmt.Errorf("GET pod %s/%s: %w", namespace, name, err)
	}
	m := &PodMeta{UID: pod.Metadata.UID, Labels: pod.Metadata.Labels}
	for _, o := range pod.Metadata.OwnerReferences {
		m.Owners = append(m.Owners, OwnerRef{Kind: o.Kind, Name: o.Name, UID: o.UID, Controller: o.Controller != nil && *o.Controller})
	}
	return m, nil
}

// statusMessage is the HTTP status and the API server's Status message.
func statusMessage(resp *http.Response, body []byte) string {
	var st struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &st) == nil && st.Message != "" {
		return resp.Status + ": " + st.Message
	}
	return resp.Status
}
