package doctor

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	"github.com/trainmeter/trainmeter/agent/internal/trainersock"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// gpuSpec shapes one mocked GPU.
type gpuSpec struct {
	noInstant bool // field 186 unsupported (GetPowerUsage still works)
	noEnergy  bool // field 83 and GetTotalEnergyConsumption unsupported
	noPower   bool // field 186 and GetPowerUsage unsupported
	mig       bool
}

// mockNVML is a dgxa100 mock whose GPUs answer the fields the doctor reads;
// every GetFieldValues call moves the counters on, like time passing.
func mockNVML(specs ...gpuSpec) *dgxa100.Server {
	s := dgxa100.New()
	s.DriverVersion, s.NvmlVersion, s.CudaDriverVersion = "570.86.15", "12.570.86.15", 12080
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return len(specs), nvml.SUCCESS }
	base := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro()
	for i, sp := range specs {
		d := s.Devices[i].(*dgxa100.Device)
		if sp.mig {
			d.MigMode = nvml.DEVICE_MIG_ENABLE
		}
		var calls atomic.Int64
		d.GetFieldValuesFunc = func(v []nvml.FieldValue) nvml.Return {
			k := calls.Add(1)
			for j := range v {
				f := &v[j]
				switch {
				case f.FieldId == nvml.FI_DEV_POWER_INSTANT && !sp.noInstant && !sp.noPower:
					f.ValueType, f.Timestamp = uint32(nvml.VALUE_TYPE_UNSIGNED_INT), base+k*200_000
					binary.NativeEndian.PutUint32(f.Value[:], 250_000)
				case f.FieldId == nvml.FI_DEV_TOTAL_ENERGY_CONSUMPTION && !sp.noEnergy:
					f.ValueType, f.Timestamp = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG), base+k*200_000
					binary.NativeEndian.PutUint64(f.Value[:], 1_000_000_000+uint64(k)*50_000)
				default:
					f.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				}
			}
			return nvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			if sp.noPower {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return 240_000, nvml.SUCCESS
		}
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
			if sp.noEnergy {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return 1_000_000_000, nvml.SUCCESS
		}
		d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 400_000, nvml.SUCCESS }
	}
	return s
}

func gpuReport(t *testing.T, spec string, lib nvml.Interface) *Report {
	t.Helper()
	cfg := agentconfig.DefaultConfig()
	cfg.GPU = spec
	r := &Report{OK: true}
	checkGPU(Options{Config: cfg, NVML: func() nvml.Interface { return lib }, Gap: 10 * time.Millisecond}, r)
	return r
}

func want(t *testing.T, r *Report, section, name string, st Status, substr ...string) Check {
	t.Helper()
	c, ok := r.Find(section, name)
	if !ok {
		t.Fatalf("no check %s/%s in %+v", section, name, r.Checks)
	}
	if c.Status != st {
		t.Errorf("%s/%s: status %s, want %s: %s (hint: %s)", section, name, c.Status, st, c.Message, c.Hint)
	}
	for _, s := range substr {
		if !strings.Contains(c.Message+" hint: "+c.Hint, s) {
			t.Errorf("%s/%s: %q (hint %q) does not contain %q", section, name, c.Message, c.Hint, s)
		}
	}
	return c
}

func TestNVMLDriverFieldsMIGAndLiveReadings(t *testing.T) {
	s := mockNVML(gpuSpec{}, gpuSpec{noEnergy: true}, gpuSpec{mig: true, noInstant: true})
	r := gpuReport(t, "nvml", s)
	want(t, r, SectionGPU, "nvml", OK, "driver 570.86.15", "NVML 12.570.86.15", "CUDA driver 12.8", "3 GPUs")
	want(t, r, SectionGPU, "gpu 0", OK, "Mock NVIDIA A100-SXM4-40GB", s.Devices[0].(*dgxa100.Device).UUID, "40960 MiB", "power limit 400 W")
	want(t, r, SectionGPU, "gpu 0 power", OK, "instant power (field 186) 250.0 W", "fresh driver timestamp", "average power (field 185) not supported")
	want(t, r, SectionGPU, "gpu 0 energy", OK, "energy counter (field 83)", "+50.000 J in 10ms")
	want(t, r, SectionGPU, "gpu 0 mig", OK, "MIG mode disabled")
	// a GPU without an energy counter
	want(t, r, SectionGPU, "gpu 1 energy", Warn, "no energy counter", "integrated from power samples")
	want(t, r, SectionGPU, "gpu 1 power", OK)
	// MIG enabled, and instant power missing (fallback to the 1 s average)
	want(t, r, SectionGPU, "gpu 2 mig", Warn, "MIG mode is enabled", "whole GPU's energy")
	want(t, r, SectionGPU, "gpu 2 power", Warn, "falls back to GetPowerUsage, now 240.0 W")
	if !r.OK || r.Count(Fail) != 0 {
		t.Errorf("report failed: %+v", r.Checks)
	}
}

func TestNVMLGPUWithNeitherPowerNorEnergyFails(t *testing.T) {
	r := gpuReport(t, "nvml", mockNVML(gpuSpec{noPower: true, noEnergy: true}))
	want(t, r, SectionGPU, "gpu 0 power", Warn, "no power reading")
	want(t, r, SectionGPU, "gpu 0 energy", Fail, "energy will be zero")
	if r.OK {
		t.Error("report OK")
	}
}

func TestNVMLNotFound(t *testing.T) {
	for _, spec := range []string{"nvml", "auto"} {
		s := dgxa100.New()
		s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
		r := gpuReport(t, spec, s)
		c := want(t, r, SectionGPU, "nvml", Fail, "libnvidia-ml.so.1 not found", "is the NVIDIA driver installed", "--gpu sim:2")
		if spec == "auto" && !strings.Contains(c.Message, "--gpu auto") {
			t.Errorf("auto: %q", c.Message)
		}
		if r.OK || len(r.Checks) != 1 {
			t.Errorf("%s: %+v", spec, r.Checks)
		}
	}
	r := gpuReport(t, "nvml", mockNVML())
	want(t, r, SectionGPU, "nvml", Fail, "0 GPUs", "nvidia-smi -L")
}

func TestSimAndReplayBackends(t *testing.T) {
	r := gpuReport(t, "sim:2", nil)
	want(t, r, SectionGPU, "backend", OK, "simulated GPUs (sim:2, seed 1)", "synthetic")
	want(t, r, SectionGPU, "gpu 0", OK, "Simulated H100", "power ", "energy ", "J in ")
	want(t, r, SectionGPU, "gpu 1", OK, "Simulated H100")

	trace := "../../../deploy/examples/replay-constant-300w.csv"
	r = gpuReport(t, "replay:"+trace, nil)
	want(t, r, SectionGPU, "backend", OK, "replay of "+trace, "recorded trace")
	want(t, r, SectionGPU, "gpu 0", OK, "power 300.0 W")

	r = gpuReport(t, "replay:/nonexistent.csv", nil)
	want(t, r, SectionGPU, "backend", Fail, "nonexistent.csv")
	r = gpuReport(t, "tpu", nil)
	want(t, r, SectionGPU, "backend", Fail, "unknown backend")
}

// nopHandler accepts every event.
type nopHandler struct{}

func (nopHandler) Handle(trainersock.Peer, trainerproto.Event) error { return nil }
func (nopHandler) Disconnected(trainersock.Peer)                     {}

// shortTemp is a short temp dir: Unix socket paths are limited to 108 bytes.
func shortTemp(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "doc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func startSocket(t *testing.T, cfg trainersock.Config) *trainersock.Server {
	t.Helper()
	s, err := trainersock.New(cfg, nopHandler{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

func socketReport(t *testing.T, path string, allowed ...uint32) *Report {
	t.Helper()
	cfg := agentconfig.DefaultConfig()
	cfg.Socket, cfg.AllowedUIDs = path, allowed
	r := &Report{OK: true}
	checkSocket(context.Background(), Options{Config: cfg, Timeout: 2 * time.Second}, r)
	return r
}

func TestSocketOfARunningAgent(t *testing.T) {
	path := filepath.Join(shortTemp(t), "agent.sock")
	srv := startSocket(t, trainersock.Config{Path: path})
	r := socketReport(t, path)
	want(t, r, SectionSocket, "path", OK, "is a socket, mode 0660")
	want(t, r, SectionSocket, "access", OK, "who may connect")
	c := want(t, r, SectionSocket, "connect", OK, "a running agent", "answered")
	if runtime.GOOS == "linux" && !strings.Contains(c.Message, "pid ") {
		t.Errorf("no peer pid: %q", c.Message)
	}
	// the probe is one unknown event, nothing else
	st := srv.Stats()
	if st.Events != 0 || st.ParseErrors["unknown_event"] != 1 {
		t.Errorf("socket stats after the probe: %+v", st)
	}
	if !r.OK {
		t.Errorf("report failed: %+v", r.Checks)
	}
}

func TestSocketProblems(t *testing.T) {
	dir := shortTemp(t)
	// missing, and missing directory
	want(t, socketReport(t, filepath.Join(dir, "none.sock")), SectionSocket, "path", Fail, "no socket at", "agent is not running")
	want(t, socketReport(t, filepath.Join(dir, "nodir", "a.sock")), SectionSocket, "path", Fail, "does not exist", "mkdir -p")

	// not a socket
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want(t, socketReport(t, file), SectionSocket, "path", Fail, "is not a socket")

	// stale: a socket file nobody accepts on
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	want(t, socketReport(t, stale), SectionSocket, "connect", Fail, "nobody accepts", "stale")

	// an agent whose uid allow-list leaves this process out
	other := uint32(os.Geteuid() + 4242)
	path := filepath.Join(dir, "uids.sock")
	startSocket(t, trainersock.Config{Path: path, AllowedUIDs: []uint32{other}})
	r := socketReport(t, path, other)
	want(t, r, SectionSocket, "connect", Fail, "refused this user", "is not allowed")
	if os.Geteuid() != 0 {
		want(t, r, SectionSocket, "access", Warn, "not in allowed_uids")
	} else {
		want(t, r, SectionSocket, "access", OK, "admits only root and")
	}
}

// fakeCollector is a gRPC server with the collector's health service and an
// ingest stream that checks tokens and the Hello the way the real one does
// (collector/internal/auth and ingest; e2e/doctor_test.go runs the doctor
// against the real collector). tokens maps token → node (nil: no tokens).
type fakeCollector struct {
	trainmeterv1.UnimplementedIngestServiceServer
	tokens map[string]string
	hellos atomic.Int64 // Hellos that got past validation (would be stored)
}

func (f *fakeCollector) Stream(stream grpc.BidiStreamingServer[trainmeterv1.StreamRequest, trainmeterv1.StreamResponse]) error {
	node := ""
	if f.tokens != nil {
		md, _ := metadata.FromIncomingContext(stream.Context())
		auth := md.Get("authorization")
		if len(auth) == 0 {
			return status.Error(codes.Unauthenticated, "this collector needs a bearer token (authorization: Bearer ...)")
		}
		var ok bool
		if node, ok = f.tokens[strings.TrimPrefix(auth[0], "Bearer ")]; !ok {
			return status.Error(codes.Unauthenticated, "invalid ingest token")
		}
	}
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	h := m.GetHello()
	if node != "" && h.GetNode() != node {
		return status.Errorf(codes.PermissionDenied, "this token belongs to node %q, not %q", node, h.GetNode())
	}
	if h.GetBootId() == "" {
		return status.Error(codes.InvalidArgument, "bad hello: hello.boot_id is empty")
	}
	f.hellos.Add(1)
	return nil
}

// collector starts a fakeCollector; files, when set, turns TLS on.
func collector(t *testing.T, tokens map[string]string, files *tlstest.Files) (string, *fakeCollector) {
	t.Helper()
	var opts []grpc.ServerOption
	if files != nil {
		creds, err := tlsfiles.ServerCredentials(tlsfiles.ServerOptions{CertFile: files.ServerCert, KeyFile: files.ServerKey}, nil)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.Creds(creds))
	}
	gs := grpc.NewServer(opts...)
	f := &fakeCollector{tokens: tokens}
	trainmeterv1.RegisterIngestServiceServer(gs, f)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	return l.Addr().String(), f
}

func collectorReport(t *testing.T, addr, node, token string, mutate ...func(*agentconfig.Config)) *Report {
	t.Helper()
	cfg := agentconfig.DefaultConfig()
	cfg.Collector, cfg.Node = addr, node
	if token != "" {
		cfg.TokenFile = filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(cfg.TokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range mutate {
		m(&cfg)
	}
	r := &Report{OK: true}
	checkCollector(context.Background(), Options{Config: cfg, Timeout: 3 * time.Second}, r)
	var js bytes.Buffer
	_ = r.WriteJSON(&js)
	var txt bytes.Buffer
	_ = r.WriteText(&txt)
	if token != "" && (strings.Contains(js.String(), token) || strings.Contains(txt.String(), token)) {
		t.Errorf("the report shows the token:\n%s", txt.String())
	}
	return r
}

func TestCollectorWithoutTokens(t *testing.T) {
	addr, f := collector(t, nil, nil)
	r := collectorReport(t, addr, "node-1", "")
	want(t, r, SectionCollector, "address", OK)
	want(t, r, SectionCollector, "reach", OK, "TCP connection")
	want(t, r, SectionCollector, "tls", OK, "plaintext to a collector on this machine")
	want(t, r, SectionCollector, "health", OK, "SERVING")
	want(t, r, SectionCollector, "token", OK, `accepts batches from node "node-1" without a token`)
	if !r.OK {
		t.Errorf("report failed: %+v", r.Checks)
	}
	// The probe's Hello is refused before anything would be stored.
	if n := f.hellos.Load(); n != 0 {
		t.Errorf("%d hellos accepted", n)
	}
}

func TestCollectorTokens(t *testing.T) {
	const tok1, tok2 = "node1-secret-doctor-7f3a", "node2-secret-doctor-b81d"
	addr, f := collector(t, map[string]string{tok1: "node-1", tok2: "node-2"}, nil)

	want(t, collectorReport(t, addr, "node-1", tok1), SectionCollector, "token", OK, `accepts this token for node "node-1"`)
	want(t, collectorReport(t, addr, "node-1", "wrong-secret-doctor-1234"), SectionCollector, "token", Fail,
		"refused the token", "invalid ingest token", "not in the collector's --ingest-tokens file")
	want(t, collectorReport(t, addr, "node-1", tok2), SectionCollector, "token", Fail,
		"belongs to another node", `belongs to node "node-2", not "node-1"`, "--node")
	want(t, collectorReport(t, addr, "node-1", ""), SectionCollector, "token", Fail, "needs an ingest token", "--token-file")
	r := collectorReport(t, addr, "node-1", "", func(c *agentconfig.Config) { c.TokenFile = "/nonexistent/token" })
	want(t, r, SectionCollector, "token", Fail, "cannot read the token file")
	// health is open: it answers without a token
	want(t, r, SectionCollector, "health", OK)
	if n := f.hellos.Load(); n != 0 {
		t.Errorf("%d hellos accepted", n)
	}
}

func TestCollectorTLS(t *testing.T) {
	files, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const tok = "node1-secret-doctor-tls-55e0"
	addr, _ := collector(t, map[string]string{tok: "node-1"}, files)

	r := collectorReport(t, addr, "node-1", tok, func(c *agentconfig.Config) { c.TLSCA = files.CAFile })
	want(t, r, SectionCollector, "tls", OK, "TLS handshake OK", "trainmeter collector", "trainmeter test CA")
	want(t, r, SectionCollector, "health", OK)
	want(t, r, SectionCollector, "token", OK)

	// a CA that did not sign the collector's certificate
	other, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r = collectorReport(t, addr, "node-1", tok, func(c *agentconfig.Config) { c.TLSCA = other.CAFile })
	want(t, r, SectionCollector, "tls", Fail, "TLS handshake failed", "unknown authority", "--tls-ca is not the CA")
	if _, ok := r.Find(SectionCollector, "token"); ok {
		t.Error("token checked after a failed handshake")
	}

	// plaintext client against a TLS collector
	r = collectorReport(t, addr, "node-1", "")
	want(t, r, SectionCollector, "health", Fail, "health check failed")
}

func TestCollectorUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := collectorReport(t, addr, "node-1", "")
	want(t, r, SectionCollector, "reach", Fail, "cannot connect", "connection refused", "trainmeter serve")
	if len(r.Checks) != 2 || r.OK {
		t.Errorf("checks after an unreachable collector: %+v", r.Checks)
	}
	r = collectorReport(t, "no-such-host.invalid:7433", "node-1", "")
	want(t, r, SectionCollector, "address", Fail, "cannot resolve no-such-host.invalid")
}

func spoolReport(t *testing.T, dir string) *Report {
	t.Helper()
	cfg := agentconfig.DefaultConfig()
	cfg.Spool = dir
	r := &Report{OK: true}
	checkSpool(Options{Config: cfg}, r)
	return r
}

func TestSpool(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spool")
	want(t, spoolReport(t, dir), SectionSpool, "spool", OK, "does not exist yet", "creates it at start")
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("doctor created the spool directory")
	}

	s, err := spool.Open(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Second)
	if err := s.Append(&trainmeterv1.Batch{WindowStart: timestamppb.New(t0), WindowEnd: timestamppb.New(t0.Add(time.Second))}); err != nil {
		t.Fatal(err)
	}
	// held by a (pretend) running agent
	want(t, spoolReport(t, dir), SectionSpool, "spool", OK, "of 1.0 GiB used", "in use by a running agent (locked)")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// stopped agent: the doctor counts what waits
	want(t, spoolReport(t, dir), SectionSpool, "spool", OK, "no agent running on it; 1 batch not yet acked")
	// and leaves it usable and unchanged
	s, err = spool.Open(dir, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 1 {
		t.Errorf("spool holds %d batches after the doctor, want 1", s.Len())
	}
	s.Close()

	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want(t, spoolReport(t, file), SectionSpool, "spool", Fail, "not a directory")
}

func TestRunAndOutput(t *testing.T) {
	addr, _ := collector(t, nil, nil)
	dir := shortTemp(t)
	sock := filepath.Join(dir, "agent.sock")
	startSocket(t, trainersock.Config{Path: sock})
	cfg := agentconfig.DefaultConfig()
	cfg.GPU, cfg.Socket, cfg.Collector, cfg.Node, cfg.Spool = "sim:1", sock, addr, "node-1", filepath.Join(dir, "spool")
	cfg.SysfsRoot = "../rapl/testdata/two-sockets"
	r := Run(context.Background(), Options{Config: cfg, Gap: 10 * time.Millisecond})
	if !r.OK || r.Count(Fail) != 0 || r.Count(Warn) != 0 {
		t.Fatalf("report: %+v", r.Checks)
	}
	hostChecks := 2 // rapl, dram; and, as root, whether the service group can read them
	if os.Geteuid() == 0 {
		hostChecks = 3
	}
	var txt bytes.Buffer
	if err := r.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"\ngpu (--gpu sim:1)\n", "\nsocket (" + sock + ")\n", "  OK    connect ", "\nhost energy (RAPL: cpu_energy_J, dram_energy_J)\n",
		"\nattribution\n  OK    processes    --gpu sim:1 lists no GPU processes", fmt.Sprintf("all %d checks OK.", 13+hostChecks)} {
		if !strings.Contains(txt.String(), s) {
			t.Errorf("text report lacks %q:\n%s", s, txt.String())
		}
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || !back.OK || len(back.Checks) != len(r.Checks) || back.Node != "node-1" {
		t.Errorf("JSON report %v: %s", err, js.String())
	}

	// a bad configuration is a FAIL line, and the rest still runs
	cfg.Interval = 0
	r = Run(context.Background(), Options{Config: cfg, Gap: 10 * time.Millisecond})
	want(t, r, SectionConfig, "config", Fail, "interval 0s")
	want(t, r, SectionSocket, "connect", OK)
	if r.OK {
		t.Error("report OK with a bad config")
	}
	txt.Reset()
	_ = r.WriteText(&txt)
	if !strings.Contains(txt.String(), "1 FAIL, 0 WARN") {
		t.Errorf("summary:\n%s", txt.String())
	}
}

// Find returns the first check of section and name.
func (r *Report) Find(section, name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Section == section && c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Mode any needs one collector of the list: one that is down is a WARN while
// another passes, a FAIL when none does; the mode line names the collector
// the agent starts with.
func TestCollectorModeAnyOneDownWarnsAllDownFails(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	up, _ := collector(t, nil, nil)
	anyReport := func(list string) *Report {
		cfg := agentconfig.DefaultConfig()
		cfg.Collector, cfg.CollectorMode, cfg.Node = list, "any", "node-1"
		r := &Report{OK: true}
		checkAnyCollector(context.Background(), Options{Config: cfg, Timeout: 3 * time.Second}, r)
		return r
	}
	r := anyReport(down + "," + up)
	want(t, r, SectionCollector, "mode", OK, "any: each batch goes to one of 2 collectors", "the agent starts with 127.0.0.1:")
	// The lines of each collector, in the order the agent tries them.
	var downReach Check
	for _, c := range r.Checks {
		if c.Name == "reach" && strings.Contains(c.Message, down) {
			downReach = c
		}
	}
	if downReach.Status != Warn || !strings.Contains(downReach.Hint, "meanwhile the agent uses the collectors that pass") {
		t.Errorf("the collector that is down: %+v, want a WARN saying the agent uses the other", downReach)
	}
	want(t, r, SectionCollector, "health", OK, "SERVING")
	if !r.OK {
		t.Errorf("one of two down failed the report: %+v", r.Checks)
	}
	r = anyReport(down)
	want(t, r, SectionCollector, "reach", Fail, "cannot connect to "+down)
	if r.OK {
		t.Errorf("the only collector down passed: %+v", r.Checks)
	}
}
