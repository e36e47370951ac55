// Package podresources tells which Kubernetes pods hold which GPUs on this
// node. It asks the kubelet's pod-resources API (k8s.io/kubelet podresources
// v1: List, and Get where the kubelet serves it) over its Unix socket, keeps
// the GPU resources (whole GPUs, MIG devices, time-sliced replicas) and maps
// each device the device plugin handed out to the GPU or MIG UUID that NVML
// reports. APIReader adds the pods' labels and owners from the API server,
// and RunFor names the run a pod (or its Job) becomes. docs/kubernetes.md.
package podresources

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is where the kubelet serves the pod-resources API.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// DefaultResources are the extended-resource name prefixes that are GPUs:
// NVIDIA's whole GPUs (nvidia.com/gpu, and nvidia.com/gpu.shared when the
// device plugin renames time-sliced replicas), its MIG devices
// (nvidia.com/mig-1g.10gb, …) and AMD's GPUs.
var DefaultResources = []string{"nvidia.com/gpu", "nvidia.com/mig-", "amd.com/gpu"}

// maxMsgSize bounds a List answer: the kubelet's own clients allow 16 MiB,
// enough for every pod a node can run.
const maxMsgSize = 16 << 20

// Options says which resources are GPUs and how device IDs become UUIDs.
type Options struct {
	// Resources are resource-name prefixes counted as GPUs; nil:
	// DefaultResources.
	Resources []string
	// IDs maps a device ID, after its replica suffix is cut, to the GPU
	// UUID, for device plugins that hand out indexes ("0", or GKE's
	// "nvidia0") or PCI addresses instead of UUIDs. IDs not in it stay as
	// they are: NVIDIA's plugin hands out GPU and MIG UUIDs by default.
	IDs map[string]string
}

func (o Options) isGPU(resource string) bool {
	res := o.Resources
	if res == nil {
		res = DefaultResources
	}
	for _, p := range res {
		if strings.HasPrefix(resource, p) {
			return true
		}
	}
	return false
}

// GPUID is the GPU a device ID names: a time-sliced replica
// ("GPU-uuid::3", GKE's "nvidia0/vgpu3") is its GPU, and IDs in o.IDs are
// mapped to their UUID.
func (o Options) GPUID(deviceID string) string {
	id := deviceID
	if i := strings.Index(id, "::"); i > 0 {
		id = id[:i]
	}
	if i := strings.Index(id, "/vgpu"); i > 0 {
		id = id[:i]
	}
	if u, ok := o.IDs[id]; ok {
		return u
	}
	return id
}

// Holder is one pod holding a GPU.
type Holder struct {
	Namespace string
	Pod       string
	// Containers of the pod that hold the GPU, sorted.
	Containers []string
	// Resources are the resource names it was allocated under, sorted
	// (nvidia.com/gpu, nvidia.com/mig-1g.10gb, …).
	Resources []string
	// DeviceIDs are the device IDs as the kubelet lists them, sorted; more
	// than one when the pod holds several replicas of a time-sliced GPU.
	DeviceIDs []string
}

// Key is the pod's NAMESPACE/NAME.
func (h Holder) Key() string { return h.Namespace + "/" + h.Pod }

// Pod is one pod holding GPUs, with the GPUs it holds.
type Pod struct {
	Namespace string
	Name      string
	GPUs      []string // GPU or MIG UUIDs (Options.GPUID), sorted
}

// Key is the pod's NAMESPACE/NAME.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// Snapshot is who holds which GPU at one List.
type Snapshot struct {
	byGPU map[string][]Holder // sorted by namespace, pod
	pods  []Pod               // sorted by namespace, name
}

// NewSnapshot reads a List (or Get) answer.
func NewSnapshot(pods []*v1.PodResources, o Options) *Snapshot {
	s := &Snapshot{byGPU: map[string][]Holder{}}
	for _, p := range pods {
		held := map[string]*Holder{} // GPU -> this pod's holder
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if !o.isGPU(d.GetResourceName()) {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					g := o.GPUID(id)
					h := held[g]
					if h == nil {
						h = &Holder{Namespace: p.GetNamespace(), Pod: p.GetName()}
						held[g] = h
					}
					h.Containers = addSorted(h.Containers, c.GetName())
					h.Resources = addSorted(h.Resources, d.GetResourceName())
					h.DeviceIDs = addSorted(h.DeviceIDs, id)
				}
			}
		}
		if len(held) == 0 {
			continue
		}
		pod := Pod{Namespace: p.GetNamespace(), Name: p.GetName()}
		for g, h := range held {
			s.byGPU[g] = append(s.byGPU[g], *h)
			pod.GPUs = append(pod.GPUs, g)
		}
		slices.Sort(pod.GPUs)
		s.pods = append(s.pods, pod)
	}
	for _, hs := range s.byGPU {
		slices.SortFunc(hs, func(a, b Holder) int { return strings.Compare(a.Key(), b.Key()) })
	}
	slices.SortFunc(s.pods, func(a, b Pod) int { return strings.Compare(a.Key(), b.Key()) })
	return s
}

func addSorted(list []string, s string) []string {
	i, found := slices.BinarySearch(list, s)
	if found {
		return list
	}
	return slices.Insert(list, i, s)
}

// Holders are the pods holding a GPU (its UUID, or a MIG device's UUID),
// sorted by namespace and name; several when the GPU is time-sliced; none
// when no pod holds it.
func (s *Snapshot) Holders(gpu string) []Holder { return s.byGPU[gpu] }

// GPUs are the GPUs some pod holds, sorted.
func (s *Snapshot) GPUs() []string {
	out := make([]string, 0, len(s.byGPU))
	for g := range s.byGPU {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// Pods are the pods holding GPUs, sorted by namespace and name.
func (s *Snapshot) Pods() []Pod { return s.pods }

// Client asks one kubelet's pod-resources API.
type Client struct {
	path string
	opts Options
	conn *grpc.ClientConn
	api  v1.PodResourcesListerClient
}

// Dial prepares a client of the kubelet at socketPath (DefaultSocket when
// empty). It does not connect: each call does, so a kubelet restart is
// only a failed call.
func Dial(socketPath string, o Options) (*Client, error) {
	if socketPath == "" {
		socketPath = DefaultSocket
	}
	conn, err := grpc.NewClient("unix:"+socketPath,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize)),
		// A restarted kubelet is found again within seconds, not after
		// gRPC's default backoff of up to 2 minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 500 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second,
		}, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("pod-resources %s: %w", socketPath, err)
	}
	return &Client{path: socketPath, opts: o, conn: conn, api: v1.NewPodResourcesListerClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Snapshot lists every pod on the node and which GPUs each holds.
func (c *Client) Snapshot(ctx context.Context) (*Snapshot, error) {
	resp, err := c.api.List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			c.conn.ResetConnectBackoff() // the next call dials at once
		}
		return nil, fmt.Errorf("pod-resources List at %s: %w", c.path, err)
	}
	return NewSnapshot(resp.GetPodResources(), c.opts), nil
}

// Pod returns the GPUs one pod holds, through Get where the kubelet serves
// it (KubeletPodResourcesGet) and List where it does not. A pod the
// kubelet does not know holds none.
func (c *Client) Pod(ctx context.Context, namespace, name string) (Pod, error) {
	none := Pod{Namespace: namespace, Name: name}
	resp, err := c.api.Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	code, msg := status.Code(err), status.Convert(err).Message()
	if code == codes.Unavailable {
		c.conn.ResetConnectBackoff() // the next call dials at once
	}
	// A kubelet without Get answers Unimplemented, or, with the feature
	// gate KubeletPodResourcesGet off, "… Get method disabled".
	if code != codes.OK && strings.Contains(msg, "disabled") {
		code = codes.Unimplemented
	}
	switch code {
	case codes.OK:
		if pods := NewSnapshot([]*v1.PodResources{resp.GetPodResources()}, c.opts).Pods(); len(pods) == 1 {
			return pods[0], nil
		}
		return none, nil
	case codes.NotFound:
		return none, nil
	case codes.Unimplemented:
		s, err := c.Snapshot(ctx)
		if err != nil {
			return none, err
		}
		for _, p := range s.Pods() {
			if p.Namespace == namespace && p.Name == name {
				return p, nil
			}
		}
		return none, nil
	}
	// The kubelet answers Get for a pod it does not know with Unknown
	// ("pod X not found in Y"): that pod holds nothing.
	if strings.Contains(msg, "not found") {
		return none, nil
	}
	return none, fmt.Errorf("pod-resources Get %s/%s at %s: %w", namespace, name, c.path, err)
}

// Detect says whether the kubelet's pod-resources API answers at
// socketPath (DefaultSocket when empty), and why not: for doctor and for
// the agent's choice of attribution sources.
func Detect(socketPath string) (ok bool, why string) {
	if socketPath == "" {
		socketPath = DefaultSocket
	}
	fi, err := os.Stat(socketPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, fmt.Sprintf("no kubelet socket at %s: not a Kubernetes node, or the agent's pod does not mount /var/lib/kubelet/pod-resources", socketPath)
	case errors.Is(err, fs.ErrPermission):
		return false, fmt.Sprintf("permission denied looking up %s: the agent runs as a user that cannot enter the kubelet's directory (run it as root, as the DaemonSet does)", socketPath)
	case err != nil:
		return false, fmt.Sprintf("kubelet socket %s: %v", socketPath, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return false, fmt.Sprintf("%s exists but is not a socket (%v)", socketPath, fi.Mode())
	}
	conn, err := net.DialTimeout("unix", socketPath, 2*time.Second)
	switch {
	case errors.Is(err, syscall.EACCES) || errors.Is(err, fs.ErrPermission):
		return false, fmt.Sprintf("permission denied connecting to %s: the socket is root's (run the agent as root, as the DaemonSet does)", socketPath)
	case errors.Is(err, syscall.ECONNREFUSED):
		return false, fmt.Sprintf("nothing listens on %s (connection refused): the kubelet is not running", socketPath)
	case err != nil:
		return false, fmt.Sprintf("cannot connect to %s: %v", socketPath, err)
	}
	conn.Close()
	c, err := Dial(socketPath, Options{})
	if err != nil {
		return false, err.Error()
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.Snapshot(ctx)
	if err != nil {
		return false, fmt.Sprintf("the kubelet at %s does not answer the pod-resources v1 List: %v", socketPath, status.Convert(err).Message())
	}
	return true, fmt.Sprintf("kubelet pod-resources API at %s: %d pods hold %d GPUs", socketPath, len(s.Pods()), len(s.GPUs()))
}
