// A fake libamd_smi.so for tests: the AMD SMI entry points the agent uses
// (internal/gpu/amdgpu/amdsmi), answering from a text file named by
// $FAKEAMDSMI_CONFIG with one GPU per line: "PCI_ADDRESS RAW_COUNT", e.g.
// "0000:03:00.0 65536000". The file is read again on every call, so a
// test moves a counter by rewriting it. The resolution is 2^-16 J
// (15.2587890625 µJ, exact in a float), as on real boards.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int amdsmi_status_t;
typedef void *amdsmi_socket_handle;
typedef void *amdsmi_processor_handle;

#define OK 0
#define INVAL 1
#define NOT_FOUND 31
#define MAX_GPUS 16

static int initialised;
static char socket_tag;

typedef struct { uint64_t bdf; uint64_t raw; } gpu_t;

static int load(gpu_t *g) {
	const char *path = getenv("FAKEAMDSMI_CONFIG");
	if (!path) return 0;
	FILE *f = fopen(path, "r");
	if (!f) return 0;
	int n = 0;
	unsigned dom, bus, dev, fn;
	unsigned long long raw;
	while (n < MAX_GPUS && fscanf(f, "%x:%x:%x.%u %llu", &dom, &bus, &dev, &fn, &raw) == 5) {
		g[n].bdf = ((uint64_t)dom << 32) | ((uint64_t)(bus & 0xff) << 8) | ((uint64_t)(dev & 0x1f) << 3) | (fn & 7);
		g[n].raw = raw;
		n++;
	}
	fclose(f);
	return n;
}

amdsmi_status_t amdsmi_init(uint64_t flags) { (void)flags; initialised = 1; return OK; }
amdsmi_status_t amdsmi_shut_down(void) { initialised = 0; return OK; }

amdsmi_status_t amdsmi_get_socket_handles(uint32_t *count, amdsmi_socket_handle *handles) {
	if (!initialised || !count) return INVAL;
	if (handles && *count >= 1) handles[0] = &socket_tag;
	*count = 1;
	return OK;
}

// Processor handles are 1-based indices into the config file's lines.
amdsmi_status_t amdsmi_get_processor_handles(amdsmi_socket_handle s, uint32_t *count, amdsmi_processor_handle *handles) {
	gpu_t g[MAX_GPUS];
	if (!initialised || s != &socket_tag || !count) return INVAL;
	int n = load(g);
	for (int i = 0; handles && i < n && i < (int)*count; i++) handles[i] = (void *)(uintptr_t)(i + 1);
	*count = (uint32_t)n;
	return OK;
}

amdsmi_status_t amdsmi_get_gpu_bdf_id(amdsmi_processor_handle h, uint64_t *id) {
	gpu_t g[MAX_GPUS];
	int n = load(g), i = (int)(uintptr_t)h - 1;
	if (!id || i < 0 || i >= n) return NOT_FOUND;
	*id = g[i].bdf;
	return OK;
}

amdsmi_status_t amdsmi_get_energy_count(amdsmi_processor_handle h, uint64_t *acc, float *res, uint64_t *ts) {
	gpu_t g[MAX_GPUS];
	int n = load(g), i = (int)(uintptr_t)h - 1;
	if (!acc || !res || !ts) return INVAL;
	if (i < 0 || i >= n) return NOT_FOUND;
	*acc = g[i].raw;
	*res = 15.2587890625f;
	*ts = 0;
	return OK;
}
