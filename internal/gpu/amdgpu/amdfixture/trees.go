package amdfixture

import "github.com/trainmeter/trainmeter/internal/gpu/amdgpu"

const gib = 1 << 30

// Counter start values: whole joules, so that every figure derived from
// them is exact in binary floating point.
const (
	// MI300XStartJ is 1,000,000 J: a 64-bit accumulator past 2^32 units.
	MI300XStartJ = 1_000_000
	// WrapStartRaw is 4 J below the 32-bit accumulator's wrap (2^32 units
	// of 2^-16 J = 65536 J).
	WrapStartRaw = 1<<32 - 4*65536
)

// MI300X is one MI300X-like board (gpu_metrics v1.5) at index i.
func MI300X(i int, pci string, powerW uint64) Board {
	return Board{
		Card: "card" + string(rune('0'+i)), PCI: pci, DeviceID: 0x74a1,
		UniqueID: []string{"a3f1c0d2e4b59687", "b4e2d1c3f5a69788"}[i%2], ProductName: "AMD Instinct MI300X OAM",
		VRAMTotal: 192 * gib, VRAMUsed: 280 << 20, BusyPct: U64(0),
		PowerInputUW: U64(powerW * 1e6), PowerCapUW: 750e6,
		Metrics: &amdgpu.MetricsSpec{Format: 1, Content: 5, EnergyRaw: MI300XStartJ << 16, PowerW: float64(powerW), TimestampNs: 1_234_000_000_000},
	}
}

// RX7900XTX is a consumer RDNA3 card: gpu_metrics v1.3 whose firmware
// leaves energy_accumulator unfilled, hwmon power1_average only.
func RX7900XTX(card, pci string) Board {
	return Board{
		Card: card, PCI: pci, DeviceID: 0x744c,
		VRAMTotal: 24 * gib, VRAMUsed: 1 << 30, BusyPct: U64(97),
		PowerAverageUW: U64(250e6), PowerCapUW: 327e6,
		Metrics: &amdgpu.MetricsSpec{Format: 1, Content: 3, EnergyUnset: true, PowerW: 250, GfxBusyPct: 97, TimestampNs: 5_000_000_000},
	}
}

// Trees are the committed fixtures under internal/gpu/amdgpu/testdata, by
// directory name.
var Trees = map[string]Tree{
	"mi300x": {
		Doc:    "Two MI300X-like boards (PCI 1002:74a1), gpu_metrics v1.5 (struct gpu_metrics_v1_5: curr_socket_power at byte 10, energy_accumulator at 88, system_clock_counter at 96) with the accumulator filled (64-bit, past 2^32 units), hwmon power1_input (the SMU's current socket power, µW) and power1_cap, unique_id and product_name from the board's FRU, mem_info_vram_total/_used (bytes), gpu_busy_percent. Three DRM clients in proc/: pid 4242 holds client 7 on card0 (1 GiB VRAM), its forked child 4243 the same client (counted once, for 4242), pid 5000 client 8 on card1.",
		Boards: []Board{MI300X(0, "0000:0c:00.0", 350), MI300X(1, "0000:22:00.0", 340)},
		Clients: []Client{
			{PID: 4242, FD: 5, PCI: "0000:0c:00.0", ClientID: 7, EngineNs: 5_000_000_000, VRAMKiB: 1 << 20},
			{PID: 4243, FD: 5, PCI: "0000:0c:00.0", ClientID: 7, EngineNs: 5_000_000_000, VRAMKiB: 1 << 20},
			{PID: 5000, FD: 7, PCI: "0000:22:00.0", ClientID: 8, EngineNs: 1_000_000_000, VRAMKiB: 512 << 10},
		},
	},
	"rx7900xtx": {
		Doc:    "A consumer Radeon RX 7900 XTX (PCI 1002:744c): gpu_metrics v1.3 (struct gpu_metrics_v1_3: average_socket_power at byte 22, energy_accumulator at 24, system_clock_counter at 32) whose energy_accumulator is all ones (the driver's 0xFF fill: this firmware does not report it), hwmon power1_average only (the SMU's 1 s average), no unique_id or product_name (no FRU on consumer boards).",
		Boards: []Board{RX7900XTX("card0", "0000:03:00.0")},
	},
	"apu-v3": {
		Doc: "A Strix-class APU's GPU (PCI 1002:150e): gpu_metrics v3.0 (struct gpu_metrics_v3_0: average_gfx_activity at byte 42, system_clock_counter at 104, average_socket_power in mW at 112; no energy accumulator), and no hwmon power file: power comes from the table.",
		Boards: []Board{{
			Card: "card1", PCI: "0000:c4:00.0", DeviceID: 0x150e,
			VRAMTotal: 512 << 20, VRAMUsed: 100 << 20, BusyPct: U64(40), NoHwmon: true,
			Metrics: &amdgpu.MetricsSpec{Format: 3, Content: 0, PowerW: 25, GfxBusyPct: 40, TimestampNs: 7_000_000_000},
		}},
	},
	"missing": {
		Doc:    "An amdgpu card with only its PCI identity (vendor, device, uevent): no hwmon, no gpu_metrics, no mem_info_vram_* or gpu_busy_percent, as under an old kernel or with power management off. Its energy cannot be measured.",
		Boards: []Board{{Card: "card0", PCI: "0000:03:00.0", DeviceID: 0x73bf, NoHwmon: true}},
	},
	"wrap-v1.0": {
		Doc: "A card with a gpu_metrics v1.0 table (struct gpu_metrics_v1_0: system_clock_counter at byte 8, average_socket_power at 34, a 32-bit energy_accumulator at 36), the accumulator 4 J below its 2^32 wrap, hwmon power1_average 300 W. Tests advance it across the wrap.",
		Boards: []Board{{
			Card: "card0", PCI: "0000:03:00.0", DeviceID: 0x73bf,
			VRAMTotal: 16 * gib, VRAMUsed: 1 << 30, BusyPct: U64(90),
			PowerAverageUW: U64(300e6), PowerCapUW: 300e6,
			Metrics: &amdgpu.MetricsSpec{Format: 1, Content: 0, EnergyRaw: WrapStartRaw, PowerW: 300, GfxBusyPct: 90, TimestampNs: 9_000_000_000},
		}},
	},
	"counter-disagrees": {
		Doc: "A card whose gpu_metrics v1.3 accumulator is filled but wrong (as on some firmware): tests advance it by a hundredth of what hwmon power1_input (300 W) says, and the backend must drop it for the power integral.",
		Boards: []Board{{
			Card: "card0", PCI: "0000:03:00.0", DeviceID: 0x740f,
			VRAMTotal: 64 * gib, VRAMUsed: 1 << 30, BusyPct: U64(90),
			PowerInputUW: U64(300e6), PowerCapUW: 300e6,
			Metrics: &amdgpu.MetricsSpec{Format: 1, Content: 3, EnergyRaw: 1000 << 16, PowerW: 300, GfxBusyPct: 90, TimestampNs: 0},
		}},
	},
	"nvidia-and-amd": {
		Doc:    "A node with an NVIDIA 3D controller (sys/bus/pci/devices/0000:41:00.0, vendor 0x10de, class 0x030200) beside one RX 7900 XTX: --gpu auto must not pick AMD here.",
		Boards: []Board{RX7900XTX("card0", "0000:03:00.0")},
		NVIDIA: true,
	},
}
