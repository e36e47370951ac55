//go:build linux && cgo

// Package amdsmi reads AMD GPUs' energy counters through AMD SMI
// (libamd_smi.so, part of ROCm) where it is installed. The library is
// loaded at run time with dlopen, as go-nvml loads NVML: the agent starts
// and measures from sysfs without it, and nothing links against it at
// build time. Only the agent imports this package; the collector stays
// free of cgo and of GPU libraries (collector/cmd/trainmeter/deps_test.go).
package amdsmi

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// The few AMD SMI entry points used, as amdsmi.h declares them.
typedef int amdsmi_status_t;
typedef void *amdsmi_socket_handle;
typedef void *amdsmi_processor_handle;

typedef amdsmi_status_t (*init_fn)(uint64_t);
typedef amdsmi_status_t (*shut_down_fn)(void);
typedef amdsmi_status_t (*socket_handles_fn)(uint32_t *, amdsmi_socket_handle *);
typedef amdsmi_status_t (*processor_handles_fn)(amdsmi_socket_handle, uint32_t *, amdsmi_processor_handle *);
typedef amdsmi_status_t (*bdf_id_fn)(amdsmi_processor_handle, uint64_t *);
typedef amdsmi_status_t (*energy_fn)(amdsmi_processor_handle, uint64_t *, float *, uint64_t *);

typedef struct {
	void *dl;
	init_fn init;
	shut_down_fn shut_down;
	socket_handles_fn socket_handles;
	processor_handles_fn processor_handles;
	bdf_id_fn bdf_id;
	energy_fn energy;
} amdsmi_lib;

static const char *lib_open(amdsmi_lib *l, const char *path) {
	l->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!l->dl) return dlerror();
	l->init = (init_fn)dlsym(l->dl, "amdsmi_init");
	l->shut_down = (shut_down_fn)dlsym(l->dl, "amdsmi_shut_down");
	l->socket_handles = (socket_handles_fn)dlsym(l->dl, "amdsmi_get_socket_handles");
	l->processor_handles = (processor_handles_fn)dlsym(l->dl, "amdsmi_get_processor_handles");
	l->bdf_id = (bdf_id_fn)dlsym(l->dl, "amdsmi_get_gpu_bdf_id");
	l->energy = (energy_fn)dlsym(l->dl, "amdsmi_get_energy_count");
	if (!l->init || !l->shut_down || !l->socket_handles || !l->processor_handles || !l->bdf_id || !l->energy) {
		dlclose(l->dl);
		l->dl = NULL;
		return "a symbol of the AMD SMI API is missing (amdsmi_init, amdsmi_get_socket_handles, amdsmi_get_processor_handles, amdsmi_get_gpu_bdf_id or amdsmi_get_energy_count)";
	}
	return NULL;
}

static amdsmi_status_t lib_init(amdsmi_lib *l, uint64_t flags) { return l->init(flags); }
static amdsmi_status_t lib_shut_down(amdsmi_lib *l) { return l->shut_down(); }
static void lib_close(amdsmi_lib *l) { if (l->dl) dlclose(l->dl); l->dl = NULL; }
static amdsmi_status_t lib_sockets(amdsmi_lib *l, uint32_t *n, amdsmi_socket_handle *h) { return l->socket_handles(n, h); }
static amdsmi_status_t lib_processors(amdsmi_lib *l, amdsmi_socket_handle s, uint32_t *n, amdsmi_processor_handle *h) { return l->processor_handles(s, n, h); }
static amdsmi_status_t lib_bdf(amdsmi_lib *l, amdsmi_processor_handle h, uint64_t *id) { return l->bdf_id(h, id); }
static amdsmi_status_t lib_energy(amdsmi_lib *l, amdsmi_processor_handle h, uint64_t *acc, float *res, uint64_t *ts) { return l->energy(h, acc, res, ts); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// DefaultPaths are tried in order by Open(""): the library path as the
// dynamic loader finds it, then ROCm's default install.
var DefaultPaths = []string{"libamd_smi.so", "/opt/rocm/lib/libamd_smi.so"}

const (
	initAMDGPUs = 1 << 1 // AMDSMI_INIT_AMD_GPUS
	maxHandles  = 256    // bounds the handle arrays: no node has more sockets or GPUs
)

// Lib is a loaded and initialised AMD SMI. It is safe for concurrent use.
type Lib struct {
	mu   sync.Mutex
	lib  C.amdsmi_lib
	path string
	// byPCI maps a GPU's PCI address (0000:0c:00.0) to its handle.
	byPCI map[string]C.amdsmi_processor_handle
}

// ErrNotInstalled is wrapped by Open's error when no library loads.
var ErrNotInstalled = errors.New("libamd_smi.so not found")

// Open loads the library at path (every DefaultPaths entry when empty),
// initialises it for AMD GPUs and maps each GPU to its PCI address.
func Open(path string) (*Lib, error) {
	paths := DefaultPaths
	if path != "" {
		paths = []string{path}
	}
	var errs []error
	for _, p := range paths {
		l := &Lib{path: p}
		cp := C.CString(p)
		msg := C.lib_open(&l.lib, cp)
		C.free(unsafe.Pointer(cp))
		if msg != nil {
			errs = append(errs, fmt.Errorf("%s: %s", p, C.GoString(msg)))
			continue
		}
		if st := C.lib_init(&l.lib, initAMDGPUs); st != 0 {
			C.lib_close(&l.lib)
			return nil, fmt.Errorf("amdsmi: %s: amdsmi_init failed (status %d)", p, int(st))
		}
		if err := l.enumerate(); err != nil {
			C.lib_shut_down(&l.lib)
			C.lib_close(&l.lib)
			return nil, fmt.Errorf("amdsmi: %s: %w", p, err)
		}
		return l, nil
	}
	return nil, fmt.Errorf("amdsmi: %w: %w", ErrNotInstalled, errors.Join(errs...))
}

func (l *Lib) enumerate() error {
	var sockets [maxHandles]C.amdsmi_socket_handle
	n := C.uint32_t(maxHandles)
	if st := C.lib_sockets(&l.lib, &n, &sockets[0]); st != 0 {
		return fmt.Errorf("amdsmi_get_socket_handles: status %d", int(st))
	}
	l.byPCI = map[string]C.amdsmi_processor_handle{}
	for s := 0; s < int(min(n, maxHandles)); s++ {
		var procs [maxHandles]C.amdsmi_processor_handle
		m := C.uint32_t(maxHandles)
		if st := C.lib_processors(&l.lib, sockets[s], &m, &procs[0]); st != 0 {
			return fmt.Errorf("amdsmi_get_processor_handles: status %d", int(st))
		}
		for k := 0; k < int(min(m, maxHandles)); k++ {
			var id C.uint64_t
			if st := C.lib_bdf(&l.lib, procs[k], &id); st != 0 {
				continue
			}
			l.byPCI[PCIAddress(uint64(id))] = procs[k]
		}
	}
	return nil
}

// PCIAddress turns AMD SMI's BDF id ((domain << 32) | (bus << 8) |
// (device << 3) | function; bits 28-31 name a partition) into the
// domain:bus:device.function form sysfs and fdinfo use.
func PCIAddress(id uint64) string {
	return fmt.Sprintf("%04x:%02x:%02x.%d", id>>32&0xffffffff, id>>8&0xff, id>>3&0x1f, id&0x7)
}

// Path is the library file that was loaded.
func (l *Lib) Path() string { return l.path }

// GPUs is how many GPUs the library maps to a PCI address.
func (l *Lib) GPUs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byPCI)
}

// EnergyCount returns the energy accumulator of the GPU at pci and its
// resolution in joules per count (amdsmi_get_energy_count gives µJ).
func (l *Lib) EnergyCount(pci string) (raw uint64, joulesPerCount float64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, found := l.byPCI[pci]
	if !found || l.lib.dl == nil {
		return 0, 0, false
	}
	var acc, ts C.uint64_t
	var res C.float
	if st := C.lib_energy(&l.lib, h, &acc, &res, &ts); st != 0 || res <= 0 {
		return 0, 0, false
	}
	return uint64(acc), float64(res) * 1e-6, true
}

// Close shuts the library down and unloads it.
func (l *Lib) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lib.dl == nil {
		return nil
	}
	C.lib_shut_down(&l.lib)
	C.lib_close(&l.lib)
	return nil
}
