package owner

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/podresources"
	"github.com/trainmeter/trainmeter/internal/kubelettest"
)

// TestKubernetesSourceMIG: the stand-in kubelet (the real pod-resources v1
// service; no kubelet runs here) lists two pods on two MIG devices of one
// GPU (mixed strategy, each under its profile's resource) and a pod on a
// whole GPU. A process on a MIG device is the pod holding that device; one
// on a MIG device no pod holds, or whose MIG device the backend could not
// tell, is left to the next source (no pod holds its GPU whole); a process
// on the whole GPU is its pod's as before.
func TestKubernetesSourceMIG(t *testing.T) {
	const gpuM, gpuW = "GPU-mmmm", "GPU-wwww"
	const migX, migY, migZ = "MIG-11111111-0000-4000-8000-00000000000a", "MIG-22222222-0000-4000-8000-00000000000b", "MIG-33333333-0000-4000-8000-00000000000c"
	k := kubelettest.New()
	sock := kubelettest.Serve(t, k)
	k.Add("ml", "left", kubelettest.Container{Name: "l", Devices: map[string][]string{"nvidia.com/mig-1g.10gb": {migX}}})
	k.Add("ml", "right", kubelettest.Container{Name: "r", Devices: map[string][]string{"nvidia.com/mig-3g.40gb": {migY}}})
	k.Add("dev", "whole", kubelettest.Container{Name: "w", Devices: map[string][]string{"nvidia.com/gpu": {gpuW}}})
	root := t.TempDir()
	for pid, uid := range map[int]int{10: 1000, 11: 1001, 12: 1002, 13: 1003, 14: 1004, 15: 1005} {
		fixture(t, root, pid, uid, "/kubepods/besteffort/c")
	}
	c, err := podresources.Dial(sock, podresources.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src := NewKubernetes(c, podRuns{}, Proc{Root: root}, nil)
	src.Refresh(context.Background(), time.Unix(1e9, 0))

	procs := []Process{
		{PID: 10, GPU: 0, GPUUUID: gpuM, MIGUUID: migX},
		{PID: 11, GPU: 0, GPUUUID: gpuM, MIGUUID: migY},
		{PID: 12, GPU: 0, GPUUUID: gpuM, MIGUUID: migY},
		{PID: 13, GPU: 0, GPUUUID: gpuM, MIGUUID: migZ}, // no pod holds it
		{PID: 14, GPU: 0, GPUUUID: gpuM},                // MIG device unknown
		{PID: 15, GPU: 1, GPUUUID: gpuW},
	}
	got := map[int]string{}
	for pid, o := range src.Owners(procs) {
		if o.Source != AttrKubernetes || !o.Persistent || o.UID != 1000+pid-10 {
			t.Errorf("pid %d: %+v", pid, o)
		}
		got[pid] = o.RunID + " " + o.Labels[podresources.LabelContainer]
	}
	want := map[int]string{10: "k8s-ml-left l", 11: "k8s-ml-right r", 12: "k8s-ml-right r", 15: "k8s-dev-whole w"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("owners:\n got %v\nwant %v", got, want)
	}

	// The left pod gone: its MIG device's process goes to the next source,
	// and its run ends; the right pod's goes on.
	k.Remove("ml", "left")
	src.Refresh(context.Background(), time.Unix(1e9+1, 0))
	if o := src.Owners(procs[:2]); len(o) != 1 || o[11].RunID != "k8s-ml-right" {
		t.Errorf("owners after the left pod left: %+v", o)
	}
	if _, done := src.Ended(Owner{Source: AttrKubernetes, RunID: "k8s-ml-left"}); !done {
		t.Error("the left pod's run did not end")
	}
	if _, done := src.Ended(Owner{Source: AttrKubernetes, RunID: "k8s-ml-right"}); done {
		t.Error("the right pod's run ended")
	}
}
