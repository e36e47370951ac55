package deploy

import (
	"bytes"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// obj is one Kubernetes object, loosely typed.
type obj map[string]any

func (o obj) kind() string { s, _ := o["kind"].(string); return s }
func (o obj) name() string { return str(get(o, "metadata", "name")) }

// get walks maps by key and lists by decimal index.
func get(v any, path ...string) any {
	for _, p := range path {
		switch m := v.(type) {
		case obj:
			v = m[p]
		case map[string]any:
			v = m[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i >= len(m) {
				return nil
			}
			v = m[i]
		default:
			return nil
		}
	}
	return v
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	}
	return ""
}

func loadManifests(t *testing.T, globs ...string) map[string]obj {
	t.Helper()
	if len(globs) == 0 {
		globs = []string{"kubernetes/*.yaml"}
	}
	var files []string
	for _, g := range globs {
		f, err := filepath.Glob(g)
		if err != nil || len(f) == 0 {
			t.Fatalf("no manifests at %s: %v", g, err)
		}
		files = append(files, f...)
	}
	all := map[string]obj{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for i := 0; ; i++ {
			var raw map[string]any
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			o := obj(raw)
			if o == nil {
				continue
			}
			if o.kind() == "" || str(o["apiVersion"]) == "" || o.name() == "" {
				t.Errorf("%s document %d: no kind, apiVersion or metadata.name", f, i)
				continue
			}
			if clusterScoped[o.kind()] {
				if ns := get(o, "metadata", "namespace"); ns != nil {
					t.Errorf("%s %s/%s: cluster-scoped, yet namespace %v", f, o.kind(), o.name(), ns)
				}
			} else if str(get(o, "metadata", "namespace")) != "trainmeter" {
				t.Errorf("%s %s/%s: namespace %q, want trainmeter", f, o.kind(), o.name(), get(o, "metadata", "namespace"))
			}
			key := o.kind() + "/" + o.name()
			if _, dup := all[key]; dup {
				t.Errorf("%s: %s twice", f, key)
			}
			all[key] = o
		}
	}
	return all
}

// clusterScoped are the kinds in these manifests that have no namespace.
var clusterScoped = map[string]bool{"Namespace": true, "ClusterRole": true, "ClusterRoleBinding": true}

// flagValues returns a container's args as flag -> value (--flag=value form).
func flagValues(c any) map[string]string {
	m := map[string]string{}
	list, _ := get(c, "args").([]any)
	for _, a := range list {
		s := str(a)
		if k, v, ok := strings.Cut(s, "="); ok && strings.HasPrefix(k, "--") {
			m[k] = v
		}
	}
	return m
}

func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	for _, k := range []string{"Namespace/trainmeter", "ConfigMap/trainmeter-agent", "ConfigMap/trainmeter-collector", "DaemonSet/trainmeter-agent",
		"Deployment/trainmeter-collector", "Service/trainmeter-collector", "PersistentVolumeClaim/trainmeter-data"} {
		if m[k] == nil {
			t.Fatalf("missing %s", k)
		}
	}

	// Collector: 1 replica, its config the ConfigMap's collector.yaml, PVC
	// at store.data's parent, probes on server.status_listen's port.
	dep := m["Deployment/trainmeter-collector"]
	if r, _ := get(dep, "spec", "replicas").(int); r != 1 {
		t.Errorf("collector replicas %v, want 1", get(dep, "spec", "replicas"))
	}
	if str(get(dep, "spec", "strategy", "type")) != "Recreate" {
		t.Error("collector strategy must be Recreate (BadgerDB in a ReadWriteOnce PVC)")
	}
	pod := get(dep, "spec", "template", "spec")
	col := get(pod, "containers", "0")
	if get(col, "args", "0") != "serve" {
		t.Errorf("collector args must start with serve: %v", get(col, "args"))
	}
	if flagValues(col)["--config"] != "/etc/trainmeter/collector.yaml" {
		t.Errorf("collector args lack --config=/etc/trainmeter/collector.yaml: %v", get(col, "args"))
	}
	configMount := ""
	for _, vm := range get(col, "volumeMounts").([]any) {
		for _, v := range get(pod, "volumes").([]any) {
			if get(v, "name") == get(vm, "name") && str(get(v, "configMap", "name")) == "trainmeter-collector" {
				configMount = str(get(vm, "mountPath"))
			}
		}
	}
	if configMount != "/etc/trainmeter" {
		t.Errorf("ConfigMap trainmeter-collector mounted at %q, want /etc/trainmeter", configMount)
	}
	var colCfg struct {
		Server struct {
			Listen       string
			StatusListen string `yaml:"status_listen"`
		}
		Store struct{ Data string }
	}
	if err := yaml.Unmarshal([]byte(str(get(m["ConfigMap/trainmeter-collector"], "data", "collector.yaml"))), &colCfg); err != nil {
		t.Fatalf("ConfigMap collector.yaml: %v", err)
	}
	flags := map[string]string{"--listen": colCfg.Server.Listen, "--status-listen": colCfg.Server.StatusListen, "--data": colCfg.Store.Data}
	listenPort := after(flags["--listen"])
	statusPort := after(flags["--status-listen"])
	if listenPort == "" || statusPort == "" || flags["--data"] == "" {
		t.Fatalf("collector.yaml needs server.listen, server.status_listen and store.data: %v", flags)
	}
	ports := map[string]string{} // container port name -> number
	for _, p := range get(col, "ports").([]any) {
		ports[str(get(p, "name"))] = str(get(p, "containerPort"))
	}
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		if str(get(col, probe, "httpGet", "path")) != "/healthz" {
			t.Errorf("collector %s path %v, want /healthz", probe, get(col, probe, "httpGet", "path"))
		}
		if p := str(get(col, probe, "httpGet", "port")); p != statusPort && ports[p] != statusPort {
			t.Errorf("collector %s port %q is not --status-listen's %s", probe, p, statusPort)
		}
	}
	dataMount := ""
	for _, vm := range get(col, "volumeMounts").([]any) {
		for _, v := range get(pod, "volumes").([]any) {
			if get(v, "name") == get(vm, "name") && str(get(v, "persistentVolumeClaim", "claimName")) == "trainmeter-data" {
				dataMount = str(get(vm, "mountPath"))
			}
		}
	}
	if dataMount == "" || !strings.HasPrefix(flags["--data"]+"/", strings.TrimSuffix(dataMount, "/")+"/") {
		t.Errorf("--data %s is not on the PVC (mounted at %q)", flags["--data"], dataMount)
	}

	// Service: selects the collector pods and exposes --listen's port.
	svc := m["Service/trainmeter-collector"]
	sel := get(svc, "spec", "selector").(map[string]any)
	labels := get(dep, "spec", "template", "metadata", "labels").(map[string]any)
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("Service selector %s=%v does not match the collector pods", k, v)
		}
	}
	svcPort := str(get(svc, "spec", "ports", "0", "port"))
	target := str(get(svc, "spec", "ports", "0", "targetPort"))
	if target != listenPort && ports[target] != listenPort {
		t.Errorf("Service targetPort %q is not --listen's %s", target, listenPort)
	}

	// Agent: its config's collector is the Service's DNS name and port.
	var agentCfg map[string]any
	if err := yaml.Unmarshal([]byte(str(get(m["ConfigMap/trainmeter-agent"], "data", "agent.yaml"))), &agentCfg); err != nil {
		t.Fatalf("ConfigMap agent.yaml: %v", err)
	}
	want := svc.name() + "." + str(get(svc, "metadata", "namespace")) + ".svc:" + svcPort
	if c := str(agentCfg["collector"]); c != want && !strings.HasPrefix(c, strings.TrimSuffix(want, ":"+svcPort)+".cluster.local:") {
		t.Errorf("agent collector %q, want %q", c, want)
	}
	ds := m["DaemonSet/trainmeter-agent"]
	apod := get(ds, "spec", "template", "spec")
	if get(apod, "hostPID") != true {
		t.Error("agent: hostPID must be true: NVML reports host PIDs, and process-tree attribution walks /proc")
	}
	if str(get(apod, "runtimeClassName")) != "nvidia" {
		t.Error("agent: runtimeClassName nvidia (NVIDIA container toolkit) expected")
	}
	if len(get(apod, "nodeSelector").(map[string]any)) == 0 {
		t.Error("agent: no nodeSelector for GPU nodes")
	}
	ac := get(apod, "containers", "0")
	hostPaths := map[string]string{} // mountPath -> hostPath
	for _, vm := range get(ac, "volumeMounts").([]any) {
		for _, v := range get(apod, "volumes").([]any) {
			if get(v, "name") == get(vm, "name") {
				if hp := str(get(v, "hostPath", "path")); hp != "" {
					hostPaths[str(get(vm, "mountPath"))] = hp
				}
				if cm := str(get(v, "configMap", "name")); cm != "" && cm != "trainmeter-agent" {
					t.Errorf("agent mounts ConfigMap %q", cm)
				}
			}
		}
	}
	sockDir := filepath.Dir(str(agentCfg["socket"]))
	if hostPaths[sockDir] != "/run/trainmeter" {
		t.Errorf("the socket's directory %s is not hostPath /run/trainmeter: %v", sockDir, hostPaths)
	}
	if sp := str(agentCfg["spool"]); hostPaths[filepath.Dir(sp)] != "/var/lib/trainmeter" {
		t.Errorf("spool %s is not under hostPath /var/lib/trainmeter: %v", sp, hostPaths)
	}
	if !strings.Contains(strings.Join(anyStrings(get(ac, "args")), " "), "--config=/etc/trainmeter/agent.yaml") {
		t.Errorf("agent args lack --config=/etc/trainmeter/agent.yaml: %v", get(ac, "args"))
	}
	agentStatus := after(str(agentCfg["status_listen"]))
	if p := str(get(ac, "readinessProbe", "httpGet", "port")); get(ac, "readinessProbe", "httpGet", "path") != "/healthz" ||
		(p != agentStatus && str(get(ac, "ports", "0", "containerPort")) != agentStatus) {
		t.Errorf("agent readinessProbe must be /healthz on status_listen's port %s", agentStatus)
	}
}

func after(hostport string) string {
	i := strings.LastIndex(hostport, ":")
	if i < 0 {
		return ""
	}
	return hostport[i+1:]
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		out = append(out, str(x))
	}
	return out
}

// TestKubernetesPostgresManifests: kubernetes/postgres/collector.yaml, applied
// instead of collector.yaml beside the namespace and the agent: 3 stateless
// replicas behind the same Service, the database URL in the ConfigMap without
// its password, the password from a Secret mounted as store.password_file.
func TestKubernetesPostgresManifests(t *testing.T) {
	m := loadManifests(t, "kubernetes/namespace.yaml", "kubernetes/agent.yaml", "kubernetes/postgres/*.yaml")
	dep := m["Deployment/trainmeter-collector"]
	if r, _ := get(dep, "spec", "replicas").(int); r != 3 {
		t.Errorf("collector replicas %v, want 3", get(dep, "spec", "replicas"))
	}
	if str(get(dep, "spec", "strategy", "type")) == "Recreate" {
		t.Error("stateless replicas roll; Recreate stops them all at once")
	}
	pod := get(dep, "spec", "template", "spec")
	col := get(pod, "containers", "0")
	if flagValues(col)["--config"] != "/etc/trainmeter/collector.yaml" {
		t.Errorf("collector args lack --config=/etc/trainmeter/collector.yaml: %v", get(col, "args"))
	}
	var cfg struct {
		Server struct{ Listen string }
		Store  struct {
			Data         string
			URL          string
			PasswordFile string `yaml:"password_file"`
		}
	}
	if err := yaml.Unmarshal([]byte(str(get(m["ConfigMap/trainmeter-collector"], "data", "collector.yaml"))), &cfg); err != nil {
		t.Fatalf("ConfigMap collector.yaml: %v", err)
	}
	u, err := url.Parse(cfg.Store.URL)
	if err != nil || u.Scheme != "postgres" || cfg.Store.Data != "" {
		t.Fatalf("store.url %q (%v), store.data %q: want a postgres:// URL and no data directory", cfg.Store.URL, err, cfg.Store.Data)
	}
	if _, has := u.User.Password(); has {
		t.Error("store.url carries a password: it belongs in the Secret")
	}
	// The password file is a key of a Secret in these manifests, mounted at its directory.
	dir, key := filepath.Split(cfg.Store.PasswordFile)
	mounted := false
	for _, vm := range get(col, "volumeMounts").([]any) {
		for _, v := range get(pod, "volumes").([]any) {
			if get(v, "name") != get(vm, "name") {
				continue
			}
			if get(v, "persistentVolumeClaim") != nil {
				t.Errorf("replica mounts a PersistentVolumeClaim (%v): replicas keep no state", get(v, "name"))
			}
			sec := m["Secret/"+str(get(v, "secret", "secretName"))]
			if sec != nil && strings.TrimSuffix(str(get(vm, "mountPath")), "/") == strings.TrimSuffix(dir, "/") &&
				(get(sec, "stringData", key) != nil || get(sec, "data", key) != nil) {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("store.password_file %s is not a key of a Secret mounted at %s", cfg.Store.PasswordFile, dir)
	}
	labels := get(dep, "spec", "template", "metadata", "labels").(map[string]any)
	for _, sel := range []any{get(m["Service/trainmeter-collector"], "spec", "selector"), get(m["PodDisruptionBudget/trainmeter-collector"], "spec", "selector", "matchLabels")} {
		sm, _ := sel.(map[string]any)
		if len(sm) == 0 {
			t.Fatalf("a selector is missing (Service or PodDisruptionBudget): %v", sel)
		}
		for k, v := range sm {
			if labels[k] != v {
				t.Errorf("selector %s=%v does not match the collector pods", k, v)
			}
		}
	}
	if n, _ := get(m["PodDisruptionBudget/trainmeter-collector"], "spec", "minAvailable").(int); n < 1 || n >= 3 {
		t.Errorf("PodDisruptionBudget minAvailable %d: want 1 or 2 of 3", n)
	}
	svc := m["Service/trainmeter-collector"]
	if target := str(get(svc, "spec", "ports", "0", "targetPort")); target != "grpc" || after(cfg.Server.Listen) != str(get(col, "ports", "0", "containerPort")) {
		t.Errorf("Service targetPort %q does not reach server.listen %s", target, cfg.Server.Listen)
	}
	var agentCfg map[string]any
	if err := yaml.Unmarshal([]byte(str(get(m["ConfigMap/trainmeter-agent"], "data", "agent.yaml"))), &agentCfg); err != nil {
		t.Fatalf("ConfigMap agent.yaml: %v", err)
	}
	if c, want := str(agentCfg["collector"]), "trainmeter-collector.trainmeter.svc:"+str(get(svc, "spec", "ports", "0", "port")); c != want {
		t.Errorf("agent collector %q, want the Service %q", c, want)
	}
}

// TestKubernetesAgentPodOwners: the agent DaemonSet can tell which pod holds
// each GPU: it mounts the kubelet's pod-resources directory read-only where
// its config's kubernetes.pod_resources_socket points, and runs as a
// ServiceAccount bound to a ClusterRole that may get and list pods and
// nothing else (pod labels and owners from the API server).
func TestKubernetesAgentPodOwners(t *testing.T) {
	m := loadManifests(t)
	ds := m["DaemonSet/trainmeter-agent"]
	pod := get(ds, "spec", "template", "spec")
	ac := get(pod, "containers", "0")
	var cfg struct {
		Kubernetes struct {
			PodResourcesSocket string   `yaml:"pod_resources_socket"`
			PodLabels          []string `yaml:"pod_labels"`
		}
	}
	if err := yaml.Unmarshal([]byte(str(get(m["ConfigMap/trainmeter-agent"], "data", "agent.yaml"))), &cfg); err != nil {
		t.Fatalf("ConfigMap agent.yaml: %v", err)
	}
	sock := cfg.Kubernetes.PodResourcesSocket
	if sock == "" {
		t.Fatal("agent.yaml: kubernetes.pod_resources_socket is empty (pods off)")
	}
	mounted := false
	for _, vm := range get(ac, "volumeMounts").([]any) {
		for _, v := range get(pod, "volumes").([]any) {
			if get(v, "name") != get(vm, "name") || str(get(v, "hostPath", "path")) != "/var/lib/kubelet/pod-resources" {
				continue
			}
			if get(vm, "readOnly") != true {
				t.Error("the kubelet's pod-resources directory is mounted writable")
			}
			if str(get(vm, "mountPath")) == filepath.Dir(sock) && filepath.Base(sock) == "kubelet.sock" {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("kubernetes.pod_resources_socket %s is not the kubelet's socket in hostPath /var/lib/kubelet/pod-resources", sock)
	}

	saName := str(get(pod, "serviceAccountName"))
	sa := m["ServiceAccount/"+saName]
	if saName == "" || sa == nil {
		t.Fatalf("the agent runs as ServiceAccount %q, which these manifests lack", saName)
	}
	if get(pod, "automountServiceAccountToken") == false || get(sa, "automountServiceAccountToken") == false {
		t.Error("the agent's service-account token is not mounted: it cannot read pod labels")
	}
	bound := false
	for key, b := range m {
		if b.kind() != "ClusterRoleBinding" {
			continue
		}
		binds := false
		for _, s := range get(b, "subjects").([]any) {
			if get(s, "kind") == "ServiceAccount" && str(get(s, "name")) == saName && str(get(s, "namespace")) == str(get(sa, "metadata", "namespace")) {
				binds = true
			}
		}
		if !binds {
			continue
		}
		role := m["ClusterRole/"+str(get(b, "roleRef", "name"))]
		if get(b, "roleRef", "kind") != "ClusterRole" || role == nil {
			t.Errorf("%s: roleRef %v is not a ClusterRole here", key, get(b, "roleRef"))
			continue
		}
		for _, r := range get(role, "rules").([]any) {
			groups, resources, verbs := anyStrings(get(r, "apiGroups")), anyStrings(get(r, "resources")), anyStrings(get(r, "verbs"))
			if strings.Join(groups, ",") != "" || strings.Join(resources, ",") != "pods" {
				t.Errorf("%s grants %v on %v: the agent needs pods in the core group only", role.name(), verbs, resources)
				continue
			}
			for _, v := range verbs {
				if v != "get" && v != "list" && v != "watch" {
					t.Errorf("%s grants %q on pods: read-only is enough", role.name(), v)
				}
			}
			if slices.Contains(verbs, "get") {
				bound = true
			}
		}
	}
	if !bound {
		t.Errorf("no ClusterRoleBinding gives ServiceAccount %s get on pods", saName)
	}
}
