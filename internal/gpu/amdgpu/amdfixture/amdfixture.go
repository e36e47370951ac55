// Package amdfixture writes sysfs and procfs trees of amdgpu cards as the
// kernel lays them out, for tests: the committed fixtures under
// internal/gpu/amdgpu/testdata are generated from Trees (go test
// ./internal/gpu/amdgpu -update), and tests that need a card's counters to move
// while an agent reads them rewrite its files with SetMetrics and SetPower
// (atomically: a reader sees the old file or the new one, never half).
package amdfixture

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
)

// Board is one amdgpu card's sysfs files. A zero or nil field leaves its
// file out, as a kernel or board without it does.
type Board struct {
	Card     string // card0
	PCI      string // 0000:03:00.0
	DeviceID uint16
	// UniqueID and ProductName exist on boards with a FRU (Instinct).
	UniqueID    string
	ProductName string
	VRAMTotal   uint64 // bytes
	VRAMUsed    uint64 // bytes
	BusyPct     *uint64
	// Hwmon power files, µW; NoHwmon leaves the hwmon directory out.
	PowerInputUW   *uint64
	PowerAverageUW *uint64
	PowerCapUW     uint64
	NoHwmon        bool
	// Metrics is the gpu_metrics table; nil leaves the file out.
	Metrics *amdgpu.MetricsSpec
}

// Client is one DRM client of a process, as /proc/PID/fdinfo/FD shows it.
type Client struct {
	PID, FD  int
	PCI      string
	ClientID int
	EngineNs uint64
	VRAMKiB  uint64
}

// Tree is a node's sysfs (under sys/) and procfs (under proc/).
type Tree struct {
	// Doc says which layout the tree models and where it comes from; the
	// generator writes it into the tree's README.
	Doc     string
	Boards  []Board
	Clients []Client
	// NVIDIA adds an NVIDIA 3D controller under sys/bus/pci/devices (bound
	// to no driver here), as on a node with both vendors' GPUs.
	NVIDIA bool
}

// U64 returns a pointer to v, for the optional fields.
func U64(v uint64) *uint64 { return &v }

// Write creates the tree under root (root/sys, root/proc).
func Write(root string, t Tree) error {
	sys := filepath.Join(root, "sys")
	if err := os.MkdirAll(filepath.Join(sys, "class", "drm"), 0o755); err != nil {
		return err
	}
	for _, b := range t.Boards {
		if err := writeBoard(sys, b); err != nil {
			return err
		}
	}
	if t.NVIDIA {
		d := filepath.Join(sys, "bus", "pci", "devices", "0000:41:00.0")
		if err := writeFiles(d, map[string]string{"vendor": "0x10de", "device": "0x2330", "class": "0x030200"}); err != nil {
			return err
		}
	}
	for _, c := range t.Clients {
		if err := WriteClient(filepath.Join(root, "proc"), c); err != nil {
			return err
		}
	}
	return nil
}

func writeBoard(sys string, b Board) error {
	dev := filepath.Join(sys, "class", "drm", b.Card, "device")
	files := map[string]string{
		"vendor": "0x1002",
		"device": fmt.Sprintf("0x%04x", b.DeviceID),
		"uevent": "DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:" + fmt.Sprintf("%04X", b.DeviceID) + "\nPCI_SLOT_NAME=" + b.PCI + "\n",
	}
	if b.UniqueID != "" {
		files["unique_id"] = b.UniqueID
	}
	if b.ProductName != "" {
		files["product_name"] = b.ProductName
	}
	if b.VRAMTotal > 0 {
		files["mem_info_vram_total"] = strconv.FormatUint(b.VRAMTotal, 10)
		files["mem_info_vram_used"] = strconv.FormatUint(b.VRAMUsed, 10)
	}
	if b.BusyPct != nil {
		files["gpu_busy_percent"] = strconv.FormatUint(*b.BusyPct, 10)
	}
	if err := writeFiles(dev, files); err != nil {
		return err
	}
	// A connector of the card, which the backend must not take for a card.
	if err := writeFiles(filepath.Join(sys, "class", "drm", b.Card+"-DP-1"), map[string]string{"status": "disconnected"}); err != nil {
		return err
	}
	if !b.NoHwmon {
		hw := map[string]string{"name": "amdgpu"}
		if b.PowerInputUW != nil {
			hw["power1_input"] = strconv.FormatUint(*b.PowerInputUW, 10)
		}
		if b.PowerAverageUW != nil {
			hw["power1_average"] = strconv.FormatUint(*b.PowerAverageUW, 10)
		}
		if b.PowerCapUW > 0 {
			hw["power1_cap"] = strconv.FormatUint(b.PowerCapUW, 10)
		}
		if err := writeFiles(filepath.Join(dev, "hwmon", "hwmon"+b.Card[len("card"):]), hw); err != nil {
			return err
		}
	}
	if b.Metrics != nil {
		return SetMetrics(sys, b.Card, *b.Metrics)
	}
	return nil
}

// WriteClient writes one fdinfo file under procfs.
func WriteClient(procfs string, c Client) error {
	body := fmt.Sprintf("pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1066\ndrm-driver:\tamdgpu\ndrm-client-id:\t%d\ndrm-pdev:\t%s\npasid:\t32790\ndrm-memory-vram:\t%d KiB\ndrm-memory-gtt: \t2048 KiB\ndrm-memory-cpu: \t0 KiB\ndrm-engine-gfx:\t%d ns\ndrm-engine-compute:\t0 ns\n",
		c.ClientID, c.PCI, c.VRAMKiB, c.EngineNs)
	return writeAtomic(filepath.Join(procfs, strconv.Itoa(c.PID), "fdinfo", strconv.Itoa(c.FD)), []byte(body))
}

// SetMetrics (re)writes card's gpu_metrics under the sysfs root sys.
func SetMetrics(sys, card string, m amdgpu.MetricsSpec) error {
	b, err := amdgpu.EncodeMetrics(m)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(sys, "class", "drm", card, "device", "gpu_metrics"), b)
}

// SetPower (re)writes card's hwmon power file (power1_input or
// power1_average) under the sysfs root sys, in µW.
func SetPower(sys, card, file string, uw uint64) error {
	return writeAtomic(filepath.Join(sys, "class", "drm", card, "device", "hwmon", "hwmon"+card[len("card"):], file), []byte(strconv.FormatUint(uw, 10)+"\n"))
}

func writeFiles(dir string, files map[string]string) error {
	for name, body := range files {
		if len(body) > 0 && body[len(body)-1] != '\n' {
			body += "\n"
		}
		if err := writeAtomic(filepath.Join(dir, name), []byte(body)); err != nil {
			return err
		}
	}
	return nil
}

func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
