package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/rapl"
)

// SectionHostEnergy holds the RAPL checks (CPU package and DRAM energy).
const SectionHostEnergy = "host energy"

// raplGroup is the group the .deb's tmpfiles rule gives read access.
const raplGroup = "trainmeter"

// checkRAPL checks what cpu_energy_J and dram_energy_J need: RAPL zones
// under the sysfs root, counters this user may read (and that the agent's
// service group may, when run as root), and a dram domain.
func checkRAPL(o Options, r *Report) {
	root := o.Config.SysfsRoot
	if root == "" {
		return
	}
	reader, err := rapl.Open(root, o.RAPLReadFile)
	if errors.Is(err, rapl.ErrNoPowercap) {
		r.add(SectionHostEnergy, "rapl", Warn, fmt.Sprintf("no RAPL counters under %s/class/powercap: cpu_energy_J, dram_energy_J and node_energy_J will stay empty", root),
			"a virtual machine or a CPU without RAPL has none; on bare metal load the driver (`sudo modprobe intel_rapl_common`; AMD CPUs need Linux 5.8 or later)")
		return
	}
	if err != nil {
		r.add(SectionHostEnergy, "rapl", Fail, err.Error(), "the powercap tree is not what the kernel documents (Documentation/power/powercap/powercap.rst)")
		return
	}
	first, err := summedRead(reader)
	if err == nil {
		time.Sleep(o.Gap)
		var second rapl.Reading
		second, err = summedRead(reader)
		if err == nil {
			raplOK(o, r, reader.Zones(), first, second)
			return
		}
	}
	if errors.Is(err, rapl.ErrPermission) {
		r.add(SectionHostEnergy, "rapl", Fail, fmt.Sprintf("the RAPL energy counters are not readable by %s (permission denied): cpu_energy_J and dram_energy_J stay empty",
			userName(os.Getuid())), rapl.PermissionFix(raplGroup))
		return
	}
	r.add(SectionHostEnergy, "rapl", Fail, "reading the RAPL counters: "+firstLine(err), "")
}

// summedRead reads the counters; only the package and dram zones' errors
// count, as the agent's (core, uncore and psys are never summed).
func summedRead(reader *rapl.Reader) (rapl.Reading, error) {
	rd, _ := reader.Read()
	return rd, rd.SummedErr()
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " (and more)"
	}
	return s
}

// raplOK reports the zones with their power over the doctor's gap, then
// whether the agent's group can read them and whether DRAM is measured.
func raplOK(o Options, r *Report, zones []rapl.Zone, a, b rapl.Reading) {
	var parts []string
	sockets := map[int]bool{}
	hasDRAM := false
	for i, z := range b.Zones {
		switch z.Domain {
		case rapl.DomainPackage:
			sockets[z.Socket] = true
		case rapl.DomainDRAM:
			hasDRAM = true
		default:
			continue
		}
		w := float64(z.EnergyUJ-a.Zones[i].EnergyUJ) / 1e6 / o.Gap.Seconds()
		parts = append(parts, fmt.Sprintf("%s/%s %.1f W", z.ID, z.Name, w))
	}
	r.add(SectionHostEnergy, "rapl", OK, fmt.Sprintf("%d socket(s) read: %s", len(sockets), strings.Join(parts, ", ")), "")
	if os.Geteuid() == 0 {
		if closed := rootOnly(zones); len(closed) > 0 {
			r.add(SectionHostEnergy, "rapl access", Warn,
				fmt.Sprintf("readable here as root, but %d counter(s) are root-only (%s): the agent, running as user %s, cannot read them", len(closed), closed[0], raplGroup),
				rapl.PermissionFix(raplGroup))
		} else {
			r.add(SectionHostEnergy, "rapl access", OK, "every energy_uj is readable by its group or everyone", "")
		}
	}
	if hasDRAM {
		r.add(SectionHostEnergy, "dram", OK, "a dram domain on each socket that has one: dram_energy_J is measured", "")
	} else {
		r.add(SectionHostEnergy, "dram", Warn, "no dram domain: dram_energy_J stays empty, node_energy_J counts GPUs and CPU packages only",
			"most AMD CPUs and many desktop and laptop Intel CPUs expose no DRAM domain; nothing to fix")
	}
}

// rootOnly lists the zones whose energy_uj neither its group nor others
// may read, described as "intel-rapl:0/energy_uj mode 0400, owner root (0), group root".
func rootOnly(zones []rapl.Zone) []string {
	var out []string
	for _, z := range zones {
		p := filepath.Join(z.Dir, "energy_uj")
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o044 != 0 {
			continue
		}
		out = append(out, z.ID+"/energy_uj "+describeFile(fi))
	}
	return out
}
