package amdgpu

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// PCI vendor ids.
const (
	VendorAMD    = 0x1002
	VendorNVIDIA = 0x10de
)

// Card is one amdgpu card as sysfs shows it.
type Card struct {
	// Name is the DRM minor's name (card0, card1, …).
	Name string
	// Dir is SYSFS/class/drm/cardN/device.
	Dir string
	// PCI is the device's PCI address (PCI_SLOT_NAME in its uevent), which
	// /proc/PID/fdinfo names as drm-pdev.
	PCI      string
	DeviceID uint16
	// Hwmon is the card's hwmon directory ("" when it has none).
	Hwmon string
}

// FindCards lists the AMD cards (PCI vendor 0x1002) under
// SYSFS/class/drm, in card-number order. Connectors (card0-DP-1) and render
// nodes are skipped. A card directory that cannot be read is an error: the
// agent would otherwise silently measure fewer GPUs than the node has.
func FindCards(sysfsRoot string) ([]Card, error) {
	dir := filepath.Join(sysfsRoot, "class", "drm")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var cards []Card
	numOf := map[string]int{} // card name -> its number
	for _, e := range ents {
		name := e.Name()
		num, ok := strings.CutPrefix(name, "card")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil {
			continue // card0-DP-1 and the like
		}
		dev := filepath.Join(dir, name, "device")
		vendor, err := readHex(filepath.Join(dev, "vendor"))
		if err != nil {
			if os.IsNotExist(err) {
				continue // a DRM minor without a PCI parent (virtual display)
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if vendor != VendorAMD {
			continue
		}
		c := Card{Name: name, Dir: dev}
		if id, err := readHex(filepath.Join(dev, "device")); err == nil {
			c.DeviceID = uint16(id)
		}
		c.PCI = pciSlot(dev)
		c.Hwmon = findHwmon(dev)
		cards = append(cards, c)
		numOf[name] = n
	}
	slices.SortFunc(cards, func(a, b Card) int { return cmp.Compare(numOf[a.Name], numOf[b.Name]) })
	return cards, nil
}

// HasNVIDIA reports whether SYSFS/bus/pci/devices holds an NVIDIA display
// or 3D controller (PCI class 0x03xxxx), whatever its driver.
func HasNVIDIA(sysfsRoot string) bool {
	dir := filepath.Join(sysfsRoot, "bus", "pci", "devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		d := filepath.Join(dir, e.Name())
		v, err := readHex(filepath.Join(d, "vendor"))
		if err != nil || v != VendorNVIDIA {
			continue
		}
		if class, err := readHex(filepath.Join(d, "class")); err == nil && class>>16 == 0x03 {
			return true
		}
	}
	return false
}

// pciSlot is the card's PCI address: PCI_SLOT_NAME from its uevent, else
// the name of the directory the device link points at.
func pciSlot(dev string) string {
	if f, err := os.Open(filepath.Join(dev, "uevent")); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "PCI_SLOT_NAME="); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	if target, err := filepath.EvalSymlinks(dev); err == nil && target != dev {
		return filepath.Base(target)
	}
	return ""
}

// findHwmon returns the card's amdgpu hwmon directory: the first
// device/hwmon/hwmonN with a power file.
func findHwmon(dev string) string {
	ents, err := os.ReadDir(filepath.Join(dev, "hwmon"))
	if err != nil {
		return ""
	}
	for _, e := range ents { // os.ReadDir sorts by name
		if !strings.HasPrefix(e.Name(), "hwmon") {
			continue
		}
		d := filepath.Join(dev, "hwmon", e.Name())
		for _, f := range []string{"power1_input", "power1_average"} {
			if _, err := os.Stat(filepath.Join(d, f)); err == nil {
				return d
			}
		}
	}
	return ""
}

func readString(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func readUint(path string) (uint64, error) {
	s, err := readString(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return v, nil
}

func readHex(path string) (uint64, error) {
	s, err := readString(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a hex number", path, s)
	}
	return v, nil
}

// knownNames names the boards whose firmware leaves product_name empty (the
// consumer cards have no FRU). Others are named by their PCI ids.
var knownNames = map[uint16]string{
	0x74a1: "AMD Instinct MI300X",
	0x74a5: "AMD Instinct MI325X",
	0x740f: "AMD Instinct MI210",
	0x740c: "AMD Instinct MI250X/MI250",
	0x744c: "AMD Radeon RX 7900 XTX/XT",
	0x73bf: "AMD Radeon RX 6900/6800 XT",
	0x150e: "AMD Radeon 890M (Strix Point)",
}
