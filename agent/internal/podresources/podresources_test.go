package podresources

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/trainmeter/trainmeter/internal/kubelettest"
)

// The kubelet is kubelettest's: the real podresources v1 service on a
// Unix socket. No kubelet runs in these tests.
type kubelet = kubelettest.Kubelet

func ctr(name string, devices map[string][]string) kubelettest.Container {
	return kubelettest.Container{Name: name, Devices: devices}
}

func serve(t *testing.T, srv v1.PodResourcesListerServer) string { return kubelettest.Serve(t, srv) }

func newKubelet(t *testing.T) (*kubelet, *Client) {
	k := kubelettest.New()
	c, err := Dial(serve(t, k), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return k, c
}

// owners renders who holds each GPU as "GPU: ns/pod[containers](ids) …".
func owners(t *testing.T, c *Client) map[string]string {
	t.Helper()
	s, err := c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range s.GPUs() {
		var parts []string
		for _, h := range s.Holders(g) {
			parts = append(parts, fmt.Sprintf("%s[%s](%s)", h.Key(), strings.Join(h.Containers, ","), strings.Join(h.DeviceIDs, ",")))
		}
		out[g] = strings.Join(parts, " ")
	}
	// Pods() agrees with Holders().
	for _, p := range s.Pods() {
		for _, g := range p.GPUs {
			if !strings.Contains(out[g], p.Key()+"[") {
				t.Errorf("Pods() says %s holds %s; Holders(%s) = %q", p.Key(), g, g, out[g])
			}
		}
	}
	return out
}

func wantOwners(t *testing.T, step string, c *Client, want map[string]string) {
	t.Helper()
	if got := owners(t, c); !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %v\nwant %v", step, got, want)
	}
}

// TestSnapshotPodsComeShareAndGo: whole GPUs, time-sliced replicas, MIG
// devices and multi-container pods, as pods arrive and leave; each step's
// owners are exact.
func TestSnapshotPodsComeShareAndGo(t *testing.T) {
	k, c := newKubelet(t)
	const gpuA, gpuB = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"
	const migX, migY = "MIG-11111111-0000-0000-0000-00000000000x", "MIG-22222222-0000-0000-0000-00000000000y"

	wantOwners(t, "no pods", c, map[string]string{})

	// A pod that holds no GPU (CPUs and another device) is nobody's GPU owner.
	k.Add("web", "nginx", ctr("nginx", map[string][]string{"example.com/nic": {"nic0"}}))
	k.Add("team-a", "train-0", ctr("trainer", map[string][]string{"nvidia.com/gpu": {gpuA}}))
	wantOwners(t, "one whole GPU", c, map[string]string{gpuA: "team-a/train-0[trainer](" + gpuA + ")"})

	// Time-slicing: the device plugin hands out replicas GPU-uuid::N, one
	// or more per pod (under nvidia.com/gpu.shared when it renames them).
	k.Add("team-b", "notebook", ctr("jupyter", map[string][]string{"nvidia.com/gpu": {gpuB + "::0"}}))
	k.Add("team-c", "infer", ctr("server", map[string][]string{"nvidia.com/gpu.shared": {gpuB + "::1", gpuB + "::3"}}))
	wantOwners(t, "time-sliced", c, map[string]string{
		gpuA: "team-a/train-0[trainer](" + gpuA + ")",
		gpuB: "team-b/notebook[jupyter](" + gpuB + "::0) team-c/infer[server](" + gpuB + "::1," + gpuB + "::3)",
	})

	// MIG devices under their profile's resource; a two-container pod
	// where each container holds one.
	k.Add("team-d", "mig-pair", ctr("left", map[string][]string{"nvidia.com/mig-1g.10gb": {migX}}),
		ctr("right", map[string][]string{"nvidia.com/mig-3g.40gb": {migY}}))
	wantOwners(t, "MIG", c, map[string]string{
		gpuA: "team-a/train-0[trainer](" + gpuA + ")",
		gpuB: "team-b/notebook[jupyter](" + gpuB + "::0) team-c/infer[server](" + gpuB + "::1," + gpuB + "::3)",
		migX: "team-d/mig-pair[left](" + migX + ")",
		migY: "team-d/mig-pair[right](" + migY + ")",
	})

	// A third tenant joins the shared GPU; the first one leaves.
	k.Add("team-a", "eval", ctr("eval", map[string][]string{"nvidia.com/gpu": {gpuB + "::2"}}),
		ctr("sidecar", map[string][]string{"nvidia.com/gpu": {gpuB + "::4"}}))
	k.Remove("team-b", "notebook")
	wantOwners(t, "shared, one left one joined", c, map[string]string{
		gpuA: "team-a/train-0[trainer](" + gpuA + ")",
		gpuB: "team-a/eval[eval,sidecar](" + gpuB + "::2," + gpuB + "::4) team-c/infer[server](" + gpuB + "::1," + gpuB + "::3)",
		migX: "team-d/mig-pair[left](" + migX + ")",
		migY: "team-d/mig-pair[right](" + migY + ")",
	})

	for _, p := range []string{"team-a/train-0", "team-a/eval", "team-c/infer", "team-d/mig-pair"} {
		ns, name, _ := strings.Cut(p, "/")
		k.Remove(ns, name)
	}
	wantOwners(t, "all gone", c, map[string]string{})
}

// TestSnapshotIDs: device plugins that hand out indexes (NVIDIA's
// DEVICE_ID_STRATEGY=index, GKE's nvidiaN/vgpuM) map through Options.IDs;
// Resources narrows what counts as a GPU.
func TestSnapshotIDs(t *testing.T) {
	pods := []*v1.PodResources{
		{Namespace: "a", Name: "p0", Containers: []*v1.ContainerResources{{Name: "c", Devices: []*v1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"0"}},
		}}}},
		{Namespace: "a", Name: "p1", Containers: []*v1.ContainerResources{{Name: "c", Devices: []*v1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"nvidia1/vgpu0"}},
			{ResourceName: "amd.com/gpu", DeviceIds: []string{"0000:c1:00.0"}},
		}}}},
		{Namespace: "b", Name: "p2", Containers: []*v1.ContainerResources{{Name: "c", Devices: []*v1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"nvidia1/vgpu1"}},
		}}}},
	}
	o := Options{IDs: map[string]string{"0": "GPU-zero", "nvidia1": "GPU-one"}}
	s := NewSnapshot(pods, o)
	got := map[string][]string{}
	for _, g := range s.GPUs() {
		for _, h := range s.Holders(g) {
			got[g] = append(got[g], h.Key())
		}
	}
	want := map[string][]string{"GPU-zero": {"a/p0"}, "GPU-one": {"a/p1", "b/p2"}, "0000:c1:00.0": {"a/p1"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	s = NewSnapshot(pods, Options{Resources: []string{"amd.com/gpu"}})
	if g := s.GPUs(); !reflect.DeepEqual(g, []string{"0000:c1:00.0"}) {
		t.Errorf("Resources amd.com/gpu only: GPUs %v", g)
	}
	if h := s.Holders("GPU-zero"); h != nil {
		t.Errorf("a GPU nobody holds has holders %v", h)
	}
}

// TestClientPod: Get where the kubelet serves it; List where Get is
// unimplemented or disabled; a pod the kubelet does not know holds none.
func TestClientPod(t *testing.T) {
	k, c := newKubelet(t)
	k.Add("ns", "p", ctr("c", map[string][]string{"nvidia.com/gpu": {"GPU-1", "GPU-2::1"}, "example.com/x": {"x"}}))
	want := Pod{Namespace: "ns", Name: "p", GPUs: []string{"GPU-1", "GPU-2"}}
	for _, mode := range []string{"", "disabled"} {
		if mode == "disabled" {
			k.DisableGet()
		}
		got, err := c.Pod(context.Background(), "ns", "p")
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Get mode %q: %+v, %v; want %+v", mode, got, err, want)
		}
		got, err = c.Pod(context.Background(), "ns", "gone")
		if err != nil || len(got.GPUs) != 0 || got.Name != "gone" {
			t.Errorf("Get mode %q, unknown pod: %+v, %v", mode, got, err)
		}
	}

	// A kubelet that predates Get: the generated server's Unimplemented.
	old := &listOnly{k: k}
	c2, err := Dial(serve(t, old), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := c2.Pod(context.Background(), "ns", "p"); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("List-only kubelet: %+v, %v; want %+v", got, err, want)
	}
}

type listOnly struct {
	v1.UnimplementedPodResourcesListerServer
	k *kubelet
}

func (l *listOnly) List(ctx context.Context, r *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	return l.k.List(ctx, r)
}

// TestClientKubeletGone: a call while the kubelet is down fails, and the
// client works again once it is back on the same path.
func TestClientKubeletGone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubelet.sock")
	c, err := Dial(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = c.Snapshot(ctx)
	cancel()
	if err == nil {
		t.Fatal("Snapshot with no kubelet succeeded")
	}
	k := kubelettest.New()
	k.Add("ns", "p", ctr("c", map[string][]string{"nvidia.com/gpu": {"GPU-1"}}))
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(g, k)
	go g.Serve(lis)
	defer g.Stop()
	// The client redials on its own (a backoff of at most 5 s); the
	// agent's next tick would see the pods again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := c.Snapshot(context.Background())
		if err == nil {
			if len(s.Holders("GPU-1")) != 1 {
				t.Fatalf("after the kubelet came back: holders %v", s.Holders("GPU-1"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client did not reach the kubelet again: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDetect: each reason Detect gives, and its success line.
func TestDetect(t *testing.T) {
	dir := t.TempDir()
	check := func(name, path string, wantOK bool, wantWhy string) {
		t.Helper()
		ok, why := Detect(path)
		if ok != wantOK || !strings.Contains(why, wantWhy) {
			t.Errorf("%s: Detect(%s) = %v, %q; want %v and %q", name, path, ok, why, wantOK, wantWhy)
		}
	}
	check("missing", filepath.Join(dir, "nope.sock"), false, "no kubelet socket at "+filepath.Join(dir, "nope.sock"))

	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	check("regular file", file, false, "is not a socket")

	stale := filepath.Join(dir, "stale.sock")
	lis, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close()
	check("no listener", stale, false, "connection refused")

	check("not podresources", serve(t, nil), false, "does not answer the pod-resources v1 List")

	k := kubelettest.New()
	k.Add("ns", "p", ctr("c", map[string][]string{"nvidia.com/gpu": {"GPU-1::0"}}))
	k.Add("ns", "q", ctr("c", map[string][]string{"nvidia.com/gpu": {"GPU-1::1", "GPU-2"}}))
	check("kubelet", serve(t, k), true, "2 pods hold 2 GPUs")
}

// TestDetectPermission: a user who cannot enter the socket's directory,
// or cannot connect to a root-only socket, is told so. As root the check
// runs in a child process as nobody.
func TestDetectPermission(t *testing.T) {
	if os.Getenv("PODRESOURCES_DETECT_CHILD") != "" {
		ok, why := Detect(os.Getenv("PODRESOURCES_DETECT_CHILD"))
		fmt.Printf("RESULT %v %s\n", ok, why)
		return
	}
	base, err := os.MkdirTemp("", "podres")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	os.Chmod(base, 0o755)
	k := kubelettest.New()
	closed := filepath.Join(base, "closed")
	os.Mkdir(closed, 0o700)
	inClosed := filepath.Join(closed, "kubelet.sock")
	rootOnly := filepath.Join(base, "kubelet.sock")
	for _, p := range []string{inClosed, rootOnly} {
		lis, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		v1.RegisterPodResourcesListerServer(g, k)
		go g.Serve(lis)
		defer g.Stop()
	}
	os.Chmod(rootOnly, 0o600)

	detect := func(path string) string {
		if os.Geteuid() != 0 {
			os.Chmod(closed, 0o000)
			defer os.Chmod(closed, 0o700)
			_, why := Detect(path)
			return why
		}
		// The test binary, copied where nobody may run it.
		bin := filepath.Join(base, "podresources.test")
		if _, err := os.Stat(bin); err != nil {
			b, err := os.ReadFile(os.Args[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bin, b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(bin, "-test.run=^TestDetectPermission$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PODRESOURCES_DETECT_CHILD="+path)
		cmd.Dir = base
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child as nobody: %v\n%s", err, out)
		}
		_, res, _ := strings.Cut(string(out), "RESULT ")
		line, _, _ := strings.Cut(res, "\n")
		return line
	}
	if why := detect(inClosed); !strings.Contains(why, "permission denied looking up "+inClosed) {
		t.Errorf("directory closed: %q", why)
	}
	if os.Geteuid() == 0 {
		if why := detect(rootOnly); !strings.Contains(why, "permission denied connecting to "+rootOnly) {
			t.Errorf("socket root's only: %q", why)
		}
	}
	if ok, why := Detect(rootOnly); os.Geteuid() == 0 && !ok {
		t.Errorf("as root: %q", why)
	}
}
