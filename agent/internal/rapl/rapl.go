// Package rapl reads the CPU package and DRAM energy counters that Linux's
// powercap framework exposes for Intel RAPL (and, under the same names, for
// AMD's RAPL on recent kernels):
//
//	<sysfs>/class/powercap/intel-rapl:N        name = package-S (or psys)
//	<sysfs>/class/powercap/intel-rapl:N:M      name = dram, core, uncore
//
// Each zone has energy_uj, a counter in microjoules that wraps to 0 after
// max_energy_range_uj (the kernel's Documentation/power/powercap/powercap.rst).
// A Reader turns the counters into energy since its first read, per zone,
// with the wrap-around undone. On current kernels energy_uj is readable by
// root only (CVE-2020-8694): a read that is refused is reported as
// ErrPermission, never as zero energy.
package rapl

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Domains: what a zone's energy covers. package is the whole socket (its
// cores, caches, uncore and, on some parts, the memory controller); core
// and uncore are parts of package, so they are reported but never added to
// it; dram is the memory attached to the socket; psys is the whole SoC on
// some laptops (it includes package and dram).
const (
	DomainPackage = "package"
	DomainDRAM    = "dram"
	DomainCore    = "core"
	DomainUncore  = "uncore"
	DomainPsys    = "psys"
)

// ErrNoPowercap means the tree has no RAPL zones: no powercap driver loaded
// (intel_rapl_common), a virtual machine, or a CPU without RAPL.
var ErrNoPowercap = errors.New("no RAPL zones under class/powercap (no intel-rapl:* entries)")

// ErrPermission means a counter exists but this process may not read it.
var ErrPermission = fs.ErrPermission

// PermissionFix says how to let group read the counters: what the .deb
// installs, and the same by hand (docs/deploy.md).
func PermissionFix(group string) string {
	return "energy_uj is readable by root only on current kernels (CVE-2020-8694): the .deb's /usr/lib/tmpfiles.d/trainmeter-rapl.conf gives group " +
		group + " read access at every boot; apply it now with `sudo systemd-tmpfiles --create trainmeter-rapl.conf`, or by hand: `sudo chgrp " +
		group + " /sys/class/powercap/intel-rapl:*/energy_uj && sudo chmod 0440 /sys/class/powercap/intel-rapl:*/energy_uj` (docs/deploy.md)"
}

// Zone is one powercap RAPL zone.
type Zone struct {
	Dir  string // the zone's directory (…/class/powercap/intel-rapl:0:1)
	ID   string // the directory's name (intel-rapl:0:1)
	Name string // the kernel's name of the zone (package-0, dram, core, psys)
	// Domain is a Domain* constant, "" for a name this package does not
	// know (reported, never summed).
	Domain string
	// Socket is the S of package-S the zone belongs to, -1 for psys and
	// zones whose package is unknown.
	Socket int
	// MaxRangeUJ is where energy_uj wraps to 0; 0 when unreadable (a
	// decrease is then not taken for a wrap).
	MaxRangeUJ uint64
}

// ReadFileFunc reads a file; tests replace it to refuse reads even to root.
type ReadFileFunc func(name string) ([]byte, error)

// Discover lists the RAPL zones under sysfsRoot, sorted by socket, then
// domain order (package, dram, core, uncore, psys, other). readFile may be
// nil (os.ReadFile).
func Discover(sysfsRoot string, readFile ReadFileFunc) ([]Zone, error) {
	if readFile == nil {
		readFile = os.ReadFile
	}
	base := filepath.Join(sysfsRoot, "class", "powercap")
	entries, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoPowercap
	}
	if err != nil {
		return nil, fmt.Errorf("rapl: %w", err)
	}
	var zones []Zone
	var parents []string // each zone's top-level zone N
	// The socket of each top-level zone N, from its name package-S, for
	// its subzones N:M.
	socketOf := map[string]int{}
	for _, e := range entries {
		id := e.Name()
		m := zoneID.FindStringSubmatch(id)
		if m == nil {
			continue // the control type "intel-rapl" itself, intel-rapl-mmio (a duplicate of package), other drivers
		}
		dir := filepath.Join(base, id)
		nameB, err := readFile(filepath.Join(dir, "name"))
		if err != nil {
			return nil, fmt.Errorf("rapl: %s: %w", id, err)
		}
		z := Zone{Dir: dir, ID: id, Name: strings.TrimSpace(string(nameB)), Socket: -1}
		switch {
		case strings.HasPrefix(z.Name, "package-"):
			z.Domain = DomainPackage
			if s, err := strconv.Atoi(strings.TrimPrefix(z.Name, "package-")); err == nil {
				z.Socket = s
				socketOf[m[1]] = s
			}
		case slices.Contains(domainOrder, z.Name):
			z.Domain = z.Name
		}
		if b, err := readFile(filepath.Join(dir, "max_energy_range_uj")); err == nil {
			z.MaxRangeUJ, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
		zones = append(zones, z)
		parents = append(parents, m[1])
	}
	for i := range zones {
		z := &zones[i]
		if s, ok := socketOf[parents[i]]; ok && z.Domain != DomainPackage && z.Domain != DomainPsys {
			z.Socket = s
		}
	}
	if len(zones) == 0 {
		return nil, ErrNoPowercap
	}
	order := func(d string) int { // a domain this package does not know sorts last
		if i := slices.Index(domainOrder, d); i >= 0 {
			return i
		}
		return len(domainOrder)
	}
	slices.SortFunc(zones, func(a, b Zone) int {
		return cmp.Or(cmp.Compare(a.Socket, b.Socket), cmp.Compare(order(a.Domain), order(b.Domain)), strings.Compare(a.ID, b.ID))
	})
	return zones, nil
}

// zoneID matches a RAPL zone's directory, intel-rapl:N or intel-rapl:N:M,
// capturing N.
var zoneID = regexp.MustCompile(`^intel-rapl:([0-9]+)(?::[0-9]+)?$`)

// domainOrder is the known domains in the order zones are sorted.
var domainOrder = []string{DomainPackage, DomainDRAM, DomainCore, DomainUncore, DomainPsys}

// ZoneEnergy is one zone's energy since the Reader's first read.
type ZoneEnergy struct {
	Zone
	// EnergyUJ is the energy since the first read (an integer, so sums of
	// counter differences stay exact).
	EnergyUJ uint64
	Wraps    int // since the first read
	// Err is this read's error (ErrPermission when refused); EnergyUJ is
	// then the last good read's.
	Err error
}

// Reading is one read of every zone.
type Reading struct {
	Zones []ZoneEnergy
}

// Sum adds the energy since the first read of every zone of domain, in
// joules, and reports whether there is such a zone and every one of them
// was read without error this time.
func (r Reading) Sum(domain string) (joules float64, ok bool) {
	var uj uint64
	n := 0
	for _, z := range r.Zones {
		if z.Domain != domain {
			continue
		}
		if z.Err != nil {
			return 0, false
		}
		uj += z.EnergyUJ
		n++
	}
	return float64(uj) / 1e6, n > 0
}

// SummedErr joins this read's errors of the package and dram zones: those
// summed into the CPU and DRAM energy. A core, uncore or psys zone that
// fails to read loses nothing of them.
func (r Reading) SummedErr() error {
	var err error
	for _, z := range r.Zones {
		if z.Err != nil && (z.Domain == DomainPackage || z.Domain == DomainDRAM) {
			err = errors.Join(err, z.Err)
		}
	}
	return err
}

// Reader turns the zones' counters into energy since its first read. It is
// safe for concurrent use.
type Reader struct {
	zones    []Zone
	readFile ReadFileFunc

	mu sync.Mutex
	c  []counter // per zone
}

// counter is one zone's state: its last raw value, the energy since the
// first read and the wraps counted.
type counter struct {
	last, cum uint64
	have      bool
	wraps     int
}

// Open discovers the zones under sysfsRoot and returns a Reader over them;
// readFile may be nil (os.ReadFile). It does not read the counters.
func Open(sysfsRoot string, readFile ReadFileFunc) (*Reader, error) {
	if readFile == nil {
		readFile = os.ReadFile
	}
	zones, err := Discover(sysfsRoot, readFile)
	if err != nil {
		return nil, err
	}
	return &Reader{zones: zones, readFile: readFile, c: make([]counter, len(zones))}, nil
}

// Zones lists the zones the Reader reads.
func (r *Reader) Zones() []Zone { return append([]Zone(nil), r.zones...) }

// ReadCounter reads one zone's raw energy_uj.
func ReadCounter(readFile ReadFileFunc, z Zone) (uint64, error) {
	b, err := readFile(filepath.Join(z.Dir, "energy_uj"))
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s/energy_uj: not a counter: %q", z.ID, strings.TrimSpace(string(b)))
	}
	return v, nil
}

// Read reads every zone. The error joins the zones' errors (each also in
// its ZoneEnergy.Err); the zones read well are in the Reading either way.
//
// A counter lower than at the previous read wrapped once: the energy is
// what was left to max_energy_range_uj plus the new value. More than one
// wrap between two reads cannot be told apart (a Xeon's package counter
// wraps after 262 kJ: about 15 minutes at 300 W, far longer than the
// agent's 1 s between reads).
func (r *Reader) Read() (Reading, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := Reading{Zones: make([]ZoneEnergy, len(r.zones))}
	var errs []error
	for i, z := range r.zones {
		c := &r.c[i]
		out.Zones[i].Zone = z
		v, err := ReadCounter(r.readFile, z)
		if err != nil {
			err = fmt.Errorf("rapl %s (%s): %w", z.ID, z.Name, err)
			out.Zones[i].Err = err
			out.Zones[i].EnergyUJ = c.cum
			errs = append(errs, err)
			continue
		}
		if c.have {
			switch {
			case v >= c.last:
				c.cum += v - c.last
			case z.MaxRangeUJ > c.last:
				c.cum += z.MaxRangeUJ - c.last + v
				c.wraps++
			default:
				// Lower with no known range: a counter reset (not a wrap);
				// count from the new value.
				c.cum += v
			}
		}
		c.last, c.have = v, true
		out.Zones[i].EnergyUJ = c.cum
		out.Zones[i].Wraps = c.wraps
	}
	return out, errors.Join(errs...)
}
