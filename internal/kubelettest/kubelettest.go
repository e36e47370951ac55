// Package kubelettest serves the real podresources v1 gRPC service
// (k8s.io/kubelet's generated code) on a Unix socket, answering List and
// Get as the kubelet does from the pods a test adds and removes. It stands
// in for the kubelet in tests: no kubelet runs in them.
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Kubelet answers the pod-resources API from its pods.
type Kubelet struct {
	v1.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	pods map[string]*v1.PodResources // NAMESPACE/NAME
	// getDisabled: Get answers as a kubelet with the KubeletPodResourcesGet
	// gate off.
	getDisabled bool
}

// New is a kubelet with no pods.
func New() *Kubelet { return &Kubelet{pods: map[string]*v1.PodResources{}} }

// List implements the pod-resources API.
func (k *Kubelet) List(context.Context, *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	resp := &v1.ListPodResourcesResponse{}
	for _, p := range k.pods {
		resp.PodResources = append(resp.PodResources, proto.Clone(p).(*v1.PodResources))
	}
	return resp, nil
}

// Get implements the pod-resources API, with the kubelet's errors.
func (k *Kubelet) Get(_ context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.getDisabled {
		return nil, errors.New("PodResources API Get method disabled")
	}
	p := k.pods[req.PodNamespace+"/"+req.PodName]
	if p == nil {
		return nil, fmt.Errorf("pod %s not found in namespace %s", req.PodName, req.PodNamespace)
	}
	return &v1.GetPodResourcesResponse{PodResources: proto.Clone(p).(*v1.PodResources)}, nil
}

// DisableGet makes Get answer as a kubelet with the KubeletPodResourcesGet
// gate off.
func (k *Kubelet) DisableGet() {
	k.mu.Lock()
	k.getDisabled = true
	k.mu.Unlock()
}

// Container is a container holding devices: resource name -> device IDs.
type Container struct {
	Name    string
	Devices map[string][]string
}

// Add puts a pod on the node (replacing one of the same name).
func (k *Kubelet) Add(namespace, name string, cs ...Container) {
	p := &v1.PodResources{Namespace: namespace, Name: name}
	for _, c := range cs {
		cr := &v1.ContainerResources{Name: c.Name, CpuIds: []int64{1, 2}}
		for res, ids := range c.Devices {
			cr.Devices = append(cr.Devices, &v1.ContainerDevices{ResourceName: res, DeviceIds: ids})
		}
		p.Containers = append(p.Containers, cr)
	}
	k.mu.Lock()
	k.pods[namespace+"/"+name] = p
	k.mu.Unlock()
}

// Remove takes a pod off the node.
func (k *Kubelet) Remove(namespace, name string) {
	k.mu.Lock()
	delete(k.pods, namespace+"/"+name)
	k.mu.Unlock()
}

// Serve serves srv's podresources v1 service (none when srv is nil) on a
// fresh Unix socket in a temporary directory, until the test ends, and
// returns the socket's path.
func Serve(t testing.TB, srv v1.PodResourcesListerServer) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubelet.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	if srv != nil {
		v1.RegisterPodResourcesListerServer(g, srv)
	}
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return path
}
