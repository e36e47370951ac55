package owner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/podresources"
	"github.com/trainmeter/trainmeter/internal/kubelettest"
)

func TestPodUIDOfCgroup(t *testing.T) {
	uid := "0f2a4c6e-1b3d-4f5a-8c7e-9d0b1a2c3e4f"
	for _, c := range []struct {
		cg   []string
		want string
	}{
		{[]string{"/kubepods/burstable/pod" + uid + "/4f2b9c0a8d1e"}, uid},                                                                                     // cgroupfs
		{[]string{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0f2a4c6e_1b3d_4f5a_8c7e_9d0b1a2c3e4f.slice/cri-containerd-ab.scope"}, uid}, // systemd
		{[]string{"/user.slice/user-0.slice/session-1.scope"}, ""},
		{[]string{"/kubepods/burstable/podnot-a-uid/x"}, ""},
	} {
		if got := PodUIDOfCgroup(c.cg); got != c.want {
			t.Errorf("PodUIDOfCgroup(%q) = %q, want %q", c.cg, got, c.want)
		}
	}
}

// podRuns names runs as the Resolver does, with UIDs an API server would
// give (uids: NAMESPACE/POD -> UID; a pod not in it was not readable).
type podRuns struct{ uids map[string]string }

func (p podRuns) Run(_ context.Context, h podresources.Holder) podresources.Run {
	var meta *podresources.PodMeta
	if uid, ok := p.uids[h.Key()]; ok {
		meta = &podresources.PodMeta{UID: uid}
	}
	return podresources.RunFor(h, meta, nil)
}

func (podRuns) Forget(*podresources.Snapshot) {}

// fixture writes a procfs entry for a process with a uid and a cgroup.
func fixture(t *testing.T, root string, pid, uid int, cgroup string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "status"), fmt.Appendf(nil, "Name:\tpython3\nUid:\t%d\t%d\t%d\t%d\n", uid, uid, uid, uid), 0o644)
	os.WriteFile(filepath.Join(dir, "cgroup"), []byte("0::"+cgroup+"\n"), 0o644)
}

// TestKubernetesSource: the stand-in kubelet (the real pod-resources v1
// service; no kubelet runs here) lists a pod on GPU A and two pods on a
// time-sliced GPU B. A's process is its pod's; B's processes are each the
// pod whose UID is in their cgroup where the UIDs are known, and left to
// the next source where they are not (or the cgroup names none of them);
// a pod's run lives while the pod is listed, ends when it is not, and no
// run ends while the kubelet does not answer.
func TestKubernetesSource(t *testing.T) {
	const gpuA, gpuB = "GPU-aaaa", "GPU-bbbb"
	uidX, uidY := "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
	k := kubelettest.New()
	sock := kubelettest.Serve(t, k)
	k.Add("ml", "train", kubelettest.Container{Name: "t", Devices: map[string][]string{"nvidia.com/gpu": {gpuA}}})
	k.Add("team-x", "nb", kubelettest.Container{Name: "j", Devices: map[string][]string{"nvidia.com/gpu": {gpuB + "::0"}}})
	k.Add("team-y", "infer", kubelettest.Container{Name: "s", Devices: map[string][]string{"nvidia.com/gpu": {gpuB + "::1", gpuB + "::2"}}})
	root := t.TempDir()
	fixture(t, root, 10, 1000, "/kubepods/burstable/podaaaaaaaa-0000-4000-8000-000000000000/c1")
	fixture(t, root, 20, 1001, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+uidX[:8]+"_1111_4111_8111_111111111111.slice/cri-containerd-x.scope")
	fixture(t, root, 30, 0, "/kubepods/pod"+uidY+"/c3")
	fixture(t, root, 40, 0, "/user.slice/user-0.slice/session-1.scope")
	procs := []Process{{PID: 10, GPU: 0, GPUUUID: gpuA}, {PID: 20, GPU: 1, GPUUUID: gpuB}, {PID: 30, GPU: 1, GPUUUID: gpuB}, {PID: 40, GPU: 1, GPUUUID: gpuB}}
	owners := func(src *Kubernetes) map[int]string {
		out := map[int]string{}
		for pid, o := range src.Owners(procs) {
			if o.Source != AttrKubernetes || !o.Persistent {
				t.Errorf("pid %d: %+v", pid, o)
			}
			out[pid] = fmt.Sprintf("%s uid=%d ns=%s", o.RunID, o.UID, o.Labels[podresources.LabelNamespace])
		}
		return out
	}
	dial := func() *podresources.Client {
		c, err := podresources.Dial(sock, podresources.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	now := time.Unix(1e9, 0)

	withUIDs := NewKubernetes(dial(), podRuns{map[string]string{"team-x/nb": uidX, "team-y/infer": uidY}}, Proc{Root: root}, nil)
	if got := owners(withUIDs); len(got) != 0 {
		t.Errorf("before the first list: %v", got)
	}
	withUIDs.Refresh(context.Background(), now)
	want := map[int]string{10: "k8s-ml-train uid=1000 ns=ml", 20: "k8s-team-x-nb uid=1001 ns=team-x", 30: "k8s-team-y-infer uid=0 ns=team-y"}
	if got := owners(withUIDs); !reflect.DeepEqual(got, want) {
		t.Errorf("owners with the pods' UIDs:\n got %v\nwant %v", got, want)
	}
	noUIDs := NewKubernetes(dial(), podRuns{}, Proc{Root: root}, nil)
	noUIDs.Refresh(context.Background(), now)
	if got, want := owners(noUIDs), map[int]string{10: "k8s-ml-train uid=1000 ns=ml"}; !reflect.DeepEqual(got, want) {
		t.Errorf("owners without the API server:\n got %v\nwant %v", got, want)
	}

	ended := func(id string) bool {
		_, done := withUIDs.Ended(Owner{Source: AttrKubernetes, RunID: id})
		return done
	}
	if ended("k8s-team-x-nb") || ended("k8s-ml-train") {
		t.Error("a listed pod's run ended")
	}
	k.Remove("team-x", "nb")
	withUIDs.Refresh(context.Background(), now)
	if end, done := withUIDs.Ended(Owner{Source: AttrKubernetes, RunID: "k8s-team-x-nb"}); !done || end.Status != "ok" {
		t.Errorf("a pod gone from the list: %+v, %v", end, done)
	}
	if ended("k8s-ml-train") {
		t.Error("a listed pod's run ended with another pod")
	}
	// Team-y's pod alone on GPU B now: every process on B is its.
	if got := owners(withUIDs); got[40] != "k8s-team-y-infer uid=0 ns=team-y" || got[20] != "k8s-team-y-infer uid=1001 ns=team-y" {
		t.Errorf("one pod on GPU B: %v", got)
	}

	// The kubelet down: nothing ends, the last list still names owners.
	gone := NewKubernetes(dial(), podRuns{}, Proc{Root: root}, nil)
	gone.Refresh(context.Background(), now)
	down, err := podresources.Dial(filepath.Join(t.TempDir(), "none.sock"), podresources.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	gone.client = down
	gone.Refresh(context.Background(), now)
	if _, done := gone.Ended(Owner{Source: AttrKubernetes, RunID: "k8s-gone-pod"}); done {
		t.Error("a run ended while the kubelet did not answer")
	}
}
