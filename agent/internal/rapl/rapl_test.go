package rapl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// copyTree copies a fixture into a temp dir, so a test can rewrite it.
func copyTree(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(filepath.Join("testdata", name))); err != nil {
		t.Fatal(err)
	}
	return dst
}

func setCounter(t *testing.T, root, zone string, uj uint64) {
	t.Helper()
	p := filepath.Join(root, "class", "powercap", zone, "energy_uj")
	if err := os.WriteFile(p, []byte(strconv.FormatUint(uj, 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDiscoverTwoSockets(t *testing.T) {
	zones, err := Discover("testdata/two-sockets", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, z := range zones {
		got = append(got, z.ID+"="+z.Name+"/"+z.Domain+"/"+strconv.Itoa(z.Socket))
	}
	want := "intel-rapl:0=package-0/package/0 intel-rapl:0:0=dram/dram/0 intel-rapl:1=package-1/package/1 intel-rapl:1:0=dram/dram/1"
	if strings.Join(got, " ") != want {
		t.Fatalf("zones:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if zones[0].MaxRangeUJ != 262143328850 || zones[1].MaxRangeUJ != 65712999613 {
		t.Fatalf("ranges %d %d", zones[0].MaxRangeUJ, zones[1].MaxRangeUJ)
	}
}

func TestDiscoverLaptopWithoutDRAM(t *testing.T) {
	zones, err := Discover("testdata/laptop-no-dram", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, z := range zones {
		got = append(got, z.Name+"/"+z.Domain+"/"+strconv.Itoa(z.Socket))
	}
	// psys has no socket (-1) and sorts first; intel-rapl-mmio is skipped.
	want := "psys/psys/-1 package-0/package/0 core/core/0 uncore/uncore/0"
	if strings.Join(got, " ") != want {
		t.Fatalf("zones:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	r, err := Open("testdata/laptop-no-dram", nil)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rd.Sum(DomainDRAM); ok {
		t.Fatal("DRAM reported on a node without a dram zone")
	}
	if _, ok := rd.Sum(DomainPackage); !ok {
		t.Fatal("package not read")
	}
}

func TestNoPowercap(t *testing.T) {
	for _, root := range []string{"testdata/no-powercap", t.TempDir()} {
		if _, err := Open(root, nil); !errors.Is(err, ErrNoPowercap) {
			t.Fatalf("%s: err = %v, want ErrNoPowercap", root, err)
		}
	}
}

// The energy is the counters' difference since the first read, per zone,
// summed per domain over the sockets, exactly (integer microjoules).
func TestReadDifferencesPerSocketAndDomain(t *testing.T) {
	root := copyTree(t, "two-sockets")
	r, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	setCounter(t, root, "intel-rapl:0", 41000000000+150_000_000)
	setCounter(t, root, "intel-rapl:1", 52000000000+170_250_000)
	setCounter(t, root, "intel-rapl:0:0", 9000000000+20_000_000)
	setCounter(t, root, "intel-rapl:1:0", 11000000000+21_500_000)
	rd, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if j, ok := rd.Sum(DomainPackage); !ok || j != 320.25 {
		t.Fatalf("package: %v %v, want 320.25 J", j, ok)
	}
	if j, ok := rd.Sum(DomainDRAM); !ok || j != 41.5 {
		t.Fatalf("dram: %v %v, want 41.5 J", j, ok)
	}
	if rd.Zones[2].EnergyUJ != 170_250_000 || rd.Zones[2].Name != "package-1" {
		t.Fatalf("zone 2: %+v", rd.Zones[2])
	}
}

func TestWrapAround(t *testing.T) {
	root := copyTree(t, "wrap")
	r, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); err != nil { // package at 262143000000, range 262143328850
		t.Fatal(err)
	}
	setCounter(t, root, "intel-rapl:0", 671_150)     // wrapped: 328850 to the range + 671150 after 0
	setCounter(t, root, "intel-rapl:0:0", 2_000_387) // dram: 999613 + 2000387
	rd, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := rd.Sum(DomainPackage); j != 1 {
		t.Fatalf("package across the wrap: %v J, want 1", j)
	}
	if j, _ := rd.Sum(DomainDRAM); j != 3 {
		t.Fatalf("dram across the wrap: %v J, want 3", j)
	}
	if rd.Zones[0].Wraps != 1 {
		t.Fatalf("wraps = %d", rd.Zones[0].Wraps)
	}
	// and on from there, no second wrap
	setCounter(t, root, "intel-rapl:0", 1_671_150)
	rd, _ = r.Read()
	if j, _ := rd.Sum(DomainPackage); j != 2 || rd.Zones[0].Wraps != 1 {
		t.Fatalf("after the wrap: %v J, %d wraps", j, rd.Zones[0].Wraps)
	}
}

// TestCounterResetWithoutKnownRange: a counter lower than at the previous
// read, where max_energy_range_uj could not be read, is a reset (say, the
// driver reloaded): the energy counts from 0 to the new value, no wrap and
// no underflow of new − previous.
func TestCounterResetWithoutKnownRange(t *testing.T) {
	root := copyTree(t, "wrap")
	if err := os.Remove(filepath.Join(root, "class", "powercap", "intel-rapl:0", "max_energy_range_uj")); err != nil {
		t.Fatal(err)
	}
	r, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if z := r.Zones()[0]; z.Domain != DomainPackage || z.MaxRangeUJ != 0 {
		t.Fatalf("zone 0: %+v, want the package with no known range", z)
	}
	if _, err := r.Read(); err != nil { // package at 262143000000
		t.Fatal(err)
	}
	setCounter(t, root, "intel-rapl:0", 500_000) // reset, then 0.5 J
	rd, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if j, _ := rd.Sum(DomainPackage); j != 0.5 || rd.Zones[0].Wraps != 0 {
		t.Fatalf("package across the reset: %v J, %d wraps; want 0.5 J, 0 wraps", j, rd.Zones[0].Wraps)
	}
	setCounter(t, root, "intel-rapl:0", 1_750_000) // and on from there
	rd, _ = r.Read()
	if j, _ := rd.Sum(DomainPackage); j != 1.75 || rd.Zones[0].Wraps != 0 {
		t.Fatalf("after the reset: %v J, %d wraps; want 1.75 J, 0 wraps", j, rd.Zones[0].Wraps)
	}
}

// energy_uj is root-only on current kernels. As root (CI) a mode does not
// stop a read, so the refusal is injected there; otherwise the file's mode
// is really 000.
func TestPermissionDenied(t *testing.T) {
	root := copyTree(t, "two-sockets")
	var readFile ReadFileFunc
	if os.Geteuid() == 0 {
		readFile = func(name string) ([]byte, error) {
			if filepath.Base(name) == "energy_uj" {
				return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
			}
			return os.ReadFile(name)
		}
	} else {
		for _, z := range []string{"intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0"} {
			if err := os.Chmod(filepath.Join(root, "class", "powercap", z, "energy_uj"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := Open(root, readFile)
	if err != nil {
		t.Fatalf("discovery needs no counter read: %v", err)
	}
	rd, err := r.Read()
	if !errors.Is(err, ErrPermission) {
		t.Fatalf("err = %v, want permission denied", err)
	}
	if _, ok := rd.Sum(DomainPackage); ok {
		t.Fatal("a refused counter counted as energy")
	}
	for _, z := range rd.Zones {
		if !errors.Is(z.Err, ErrPermission) {
			t.Fatalf("%s: %v", z.ID, z.Err)
		}
	}
}

func TestGarbledCounterIsAnError(t *testing.T) {
	root := copyTree(t, "two-sockets")
	r, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "class", "powercap", "intel-rapl:1", "energy_uj"), []byte("lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rd, err := r.Read()
	if err == nil || !strings.Contains(err.Error(), "not a counter") {
		t.Fatalf("err = %v", err)
	}
	if _, ok := rd.Sum(DomainPackage); ok {
		t.Fatal("package summed with one socket unread")
	}
	if _, ok := rd.Sum(DomainDRAM); !ok {
		t.Fatal("dram lost because a package counter was garbled")
	}
}

// BenchmarkRead is one read of a two-socket node's four counters (what the
// agent does once a second).
func BenchmarkRead(b *testing.B) {
	r, err := Open("testdata/two-sockets", nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := r.Read(); err != nil {
			b.Fatal(err)
		}
	}
}

// AMD's RAPL: packages only, a shorter range, no DRAM.
func TestAMDTwoSocketsWithoutDRAM(t *testing.T) {
	root := copyTree(t, "amd-epyc-2s")
	r, err := Open(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); err != nil {
		t.Fatal(err)
	}
	setCounter(t, root, "intel-rapl:0", 100) // wrapped at AMD's range
	rd, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rd.Sum(DomainDRAM); ok {
		t.Fatal("DRAM on AMD")
	}
	if len(rd.Zones) != 2 || rd.Zones[1].Name != "package-1" || rd.Zones[1].Socket != 1 {
		t.Fatalf("zones %+v", rd.Zones)
	}
	if z := rd.Zones[0]; z.EnergyUJ != 65532610987-43114655012+100 || z.Wraps != 1 {
		t.Fatalf("package-0 across AMD's wrap: %d µJ, %d wraps", z.EnergyUJ, z.Wraps)
	}
}
