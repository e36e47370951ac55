package podresources

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// apiServer stands in for the Kubernetes API server over TLS: it serves
// GET /api/v1/namespaces/NS/pods/NAME to the one token it accepts, 403
// (with a Status body, as the API server does) to any other.
type apiServer struct {
	*httptest.Server
	mu    sync.Mutex
	token string
	pods  map[string]any // NS/NAME -> the pod object
	gets  int
}

func newAPIServer(t *testing.T) (*apiServer, APIConfig) {
	a := &apiServer{token: "tok-1", pods: map[string]any{}}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	a.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	a.StartTLS()
	t.Cleanup(a.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Certificate().Raw}), 0o600)
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("tok-1\n"), 0o600)
	return a, APIConfig{Server: a.URL, TokenFile: tok, CAFile: ca}
}

func (a *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gets++
	w.Header().Set("Content-Type", "application/json")
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/")
	ns, name, _ := strings.Cut(rest, "/pods/")
	if r.Header.Get("Authorization") != "Bearer "+a.token {
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
			"message": `pods "` + name + `" is forbidden: User "system:serviceaccount:trainmeter:default" cannot get resource "pods" in API group "" in the namespace "` + ns + `"`})
		return
	}
	pod, found := a.pods[ns+"/"+name]
	if !ok || r.Method != http.MethodGet || !found {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "code": 404, "message": `pods "` + name + `" not found`})
		return
	}
	json.NewEncoder(w).Encode(pod)
}

func (a *apiServer) addPod(ns, name, uid string, labels map[string]string, owners ...map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[ns+"/"+name] = map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": uid, "labels": labels, "ownerReferences": owners},
		"spec":     map[string]any{"nodeName": "gpu-1"}}
}

func (a *apiServer) setToken(tok string) {
	a.mu.Lock()
	a.token = tok
	a.mu.Unlock()
}

// logs records the reader's log lines.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, string(bytes.TrimSpace(p)))
		return len(p), nil
	}), nil))
}

func (l *logs) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

var trueP = true

// TestAPIReader: labels and owners read over TLS with the service
// account's token; the token is read again at each request (rotation);
// 403 and 404 are told apart; the reader says once that it has no
// access, and once that it has again.
func TestAPIReader(t *testing.T) {
	a, cfg := newAPIServer(t)
	var l logs
	r, err := NewAPIReader(cfg, l.logger())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	a.addPod("ml", "bert-0-x7k2p", "uid-pod", map[string]string{"team": "nlp", "app": "bert"},
		map[string]any{"apiVersion": "batch/v1", "kind": "Job", "name": "bert-0", "uid": "uid-job", "controller": &trueP})
	m, err := r.Pod(ctx, "ml", "bert-0-x7k2p")
	if err != nil {
		t.Fatal(err)
	}
	want := &PodMeta{UID: "uid-pod", Labels: map[string]string{"team": "nlp", "app": "bert"},
		Owners: []OwnerRef{{Kind: "Job", Name: "bert-0", UID: "uid-job", Controller: true}}}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("got %+v, want %+v", m, want)
	}
	if j := m.Job(); j == nil || j.Name != "bert-0" {
		t.Errorf("Job() = %v", j)
	}

	if _, err := r.Pod(ctx, "ml", "gone"); !errors.Is(err, ErrPodNotFound) {
		t.Errorf("missing pod: %v, want ErrPodNotFound", err)
	}

	// The RBAC is taken away: 403, said once over two reads.
	a.setToken("tok-other")
	for range 2 {
		_, err := r.Pod(ctx, "ml", "bert-0-x7k2p")
		if !errors.Is(err, ErrNoAccess) || !strings.Contains(err.Error(), "cannot get resource") {
			t.Errorf("403: %v", err)
		}
	}
	// The kubelet rotates the token: the next read uses the new one.
	os.WriteFile(cfg.TokenFile, []byte("tok-other"), 0o600)
	if _, err := r.Pod(ctx, "ml", "bert-0-x7k2p"); err != nil {
		t.Errorf("after token rotation: %v", err)
	}
	lines := l.get()
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "namespace, pod and container only") ||
		!strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "answers again") {
		t.Errorf("logs: want one warning then one recovery line, got %q", lines)
	}

	// An API server whose certificate the CA does not sign is refused.
	bad := cfg
	bad.CAFile = filepath.Join(t.TempDir(), "other-ca.crt")
	os.WriteFile(bad.CAFile, otherCA(t), 0o600)
	r2, err := NewAPIReader(bad, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Pod(ctx, "ml", "bert-0-x7k2p"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("untrusted server: %v", err)
	}

	for _, c := range []APIConfig{{Server: "http://x:1", CAFile: cfg.CAFile}, {Server: a.URL, CAFile: cfg.TokenFile}} {
		if _, err := NewAPIReader(c, nil); err == nil {
			t.Errorf("NewAPIReader(%+v) accepted", c)
		}
	}
}

func TestInClusterConfigOutside(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, ok, why := InClusterConfig(); ok || !strings.Contains(why, "not in a Kubernetes pod") {
		t.Errorf("outside a pod: %v %q", ok, why)
	}
}

// TestRunFor: a Job's pod becomes the Job's run, another pod its own;
// selected pod labels are copied, never over the reserved ones; without
// the API server a pod is its own run with namespace, pod and container.
func TestRunFor(t *testing.T) {
	h := Holder{Namespace: "ml", Pod: "bert-0-x7k2p", Containers: []string{"trainer", "aux"}}
	meta := &PodMeta{UID: "u", Labels: map[string]string{"team": "nlp", "k8s.namespace": "spoof", "other": "x"},
		Owners: []OwnerRef{{Kind: "Job", Name: "bert-0", Controller: true}}}
	keys := []string{"team", "k8s.namespace", "absent"}
	cases := []struct {
		name string
		meta *PodMeta
		want Run
	}{
		{"job", meta, Run{ID: "k8s-ml-job-bert-0", Name: "bert-0", Job: true,
			Labels: map[string]string{"k8s.namespace": "ml", "k8s.job": "bert-0", "k8s.container": "trainer,aux", "team": "nlp"}, PodUID: "u"}},
		{"replicaset", &PodMeta{Labels: map[string]string{"team": "cv"}, Owners: []OwnerRef{{Kind: "ReplicaSet", Name: "rs", Controller: true}}},
			Run{ID: "k8s-ml-bert-0-x7k2p", Name: "bert-0-x7k2p",
				Labels: map[string]string{"k8s.namespace": "ml", "k8s.pod": "bert-0-x7k2p", "k8s.container": "trainer,aux", "team": "cv"}}},
		{"no API server", nil, Run{ID: "k8s-ml-bert-0-x7k2p", Name: "bert-0-x7k2p",
			Labels: map[string]string{"k8s.namespace": "ml", "k8s.pod": "bert-0-x7k2p", "k8s.container": "trainer,aux"}}},
	}
	for _, c := range cases {
		if got := RunFor(h, c.meta, keys); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %+v\nwant %+v", c.name, got, c.want)
		}
	}
	long := RunFor(Holder{Namespace: strings.Repeat("n", 63), Pod: strings.Repeat("p", 253)}, nil, nil)
	long2 := RunFor(Holder{Namespace: strings.Repeat("n", 63), Pod: strings.Repeat("p", 252) + "q"}, nil, nil)
	if len(long.ID) != maxRunID || long.ID == long2.ID {
		t.Errorf("long ids: %d bytes, distinct %v", len(long.ID), long.ID != long2.ID)
	}
}

// TestResolver: pods on a kubelet resolved through the API server: a
// Job's pods on two GPUs share the Job's run; a pod the service account
// may not read is its own run; a pod's run stays what it was first even
// when the API server answers later, until the pod is gone.
func TestResolver(t *testing.T) {
	k, c := newKubelet(t)
	a, cfg := newAPIServer(t)
	r, err := NewAPIReader(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	res := NewResolver(r, []string{"team"})
	ctx := context.Background()
	job := map[string]any{"kind": "Job", "name": "sweep", "uid": "j1", "controller": true}
	a.addPod("ml", "sweep-0-aaaaa", "p1", map[string]string{"team": "nlp"}, job)
	a.addPod("ml", "sweep-1-bbbbb", "p2", map[string]string{"team": "nlp"}, job)
	k.Add("ml", "sweep-0-aaaaa", ctr("t", map[string][]string{"nvidia.com/gpu": {"GPU-1"}}))
	k.Add("ml", "sweep-1-bbbbb", ctr("t", map[string][]string{"nvidia.com/gpu": {"GPU-2"}}))
	k.Add("dev", "scratch", ctr("sh", map[string][]string{"nvidia.com/gpu": {"GPU-3::0"}})) // not on the API server

	runs := func() map[string]string {
		s, err := c.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res.Forget(s)
		out := map[string]string{}
		for _, g := range s.GPUs() {
			for _, h := range s.Holders(g) {
				run := res.Run(ctx, h)
				out[g] += run.ID + " team=" + run.Labels["team"] + ";"
			}
		}
		return out
	}
	want := map[string]string{"GPU-1": "k8s-ml-job-sweep team=nlp;", "GPU-2": "k8s-ml-job-sweep team=nlp;", "GPU-3": "k8s-dev-scratch team=;"}
	if got := runs(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	a.mu.Lock()
	before := a.gets
	a.mu.Unlock()
	// The API server now knows the scratch pod as a Job's: its run stays.
	a.addPod("dev", "scratch", "p3", map[string]string{"team": "x"}, map[string]any{"kind": "Job", "name": "j", "controller": true})
	if got := runs(); !reflect.DeepEqual(got, want) {
		t.Errorf("second look: got %v, want %v", got, want)
	}
	a.mu.Lock()
	if a.gets != before {
		t.Errorf("known pods read again: %d GETs", a.gets-before)
	}
	a.mu.Unlock()
	// Gone and back under the same name: read afresh.
	k.Remove("dev", "scratch")
	runs()
	k.Add("dev", "scratch", ctr("sh", map[string][]string{"nvidia.com/gpu": {"GPU-3::0"}}))
	want["GPU-3"] = "k8s-dev-job-j team=x;"
	if got := runs(); !reflect.DeepEqual(got, want) {
		t.Errorf("pod recreated: got %v, want %v", got, want)
	}
}

// otherCA is a self-signed certificate that signed nothing the test
// server shows.
func otherCA(t *testing.T) []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other"}, IsCA: true,
		NotBefore: time.Unix(0, 0), NotAfter: time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC), BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
