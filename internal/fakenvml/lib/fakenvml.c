/*
 * A fake libnvidia-ml.so.1 for tests: the NVML entry points trainmeter-agent,
 * its doctor/validate and process attribution call, with the signatures and
 * structs of the nvml.h go-nvml ships (compiled against it, so a mismatch is a
 * compile error), backed by the sensor model in ../sensor.c.
 *
 * Configured by the file named in $FAKENVML_CONFIG: one "key value" per line,
 * "#" comments. Keys without a prefix apply to every GPU; "gpuN.key" to GPU N
 * only; later lines win. Library-wide keys: gpus, epoch_us (time 0 of the
 * trace, µs since 1970; default: when the library is first initialised),
 * driver_version, procs_file (lines "GPU PID USED_MIB SM_PCT [GI CI]", re-read on
 * each process query; GI CI: the MIG device's GPU and compute instance ids),
 * mig (repeatable: "GPU GI CI SLICES UUID", a MIG device of GPU with its
 * instance ids, its GPU instance's compute slices and its UUID). Per-GPU
 * keys: see fn_gpu_set in ../sensor.c.
 */
#include <nvml.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../sensor.h"

#define MAX_GPUS 16

struct nvmlDevice_st {
	int index;
	fn_gpu g;
};

static struct nvmlDevice_st devs[MAX_GPUS];

/* MIG devices: migdevs[k] is the handle of migs[k]. */
#define MAX_MIGS 56
struct mig {
	int gpu;
	unsigned int gi, ci, slices;
	char uuid[96];
};
static struct mig migs[MAX_MIGS];
static struct nvmlDevice_st migdevs[MAX_MIGS];
static int nmigs;

/* A GPU instance handle names one MIG device of that instance. */
struct nvmlGpuInstance_st {
	int mig;
};
static struct nvmlGpuInstance_st gis[MAX_MIGS];
static int ngpus = 2;
static long long epoch_us;
static char driver_version[64] = "550.54.15";
static char procs_file[512];
static int init_count;

static long long now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static double now_ms(void) { return (now_us() - epoch_us) / 1000.0; }

static char *trim(char *s)
{
	while (isspace((unsigned char)*s)) s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
	return s;
}

/* configure reads $FAKENVML_CONFIG twice: library-wide keys first (the GPU
 * count), then the per-GPU keys in file order. A bad line is reported on
 * stderr and fails nvmlInit, as a broken driver install would. */
static nvmlReturn_t configure(void)
{
	const char *path = getenv("FAKENVML_CONFIG");
	epoch_us = now_us();
	nmigs = 0;
	for (int i = 0; i < MAX_GPUS; i++) {
		devs[i].index = i;
		fn_gpu_defaults(&devs[i].g, i);
	}
	if (!path || !*path)
		return NVML_SUCCESS;
	for (int pass = 0; pass < 2; pass++) {
		FILE *f = fopen(path, "r");
		if (!f) {
			fprintf(stderr, "fakenvml: cannot open FAKENVML_CONFIG %s\n", path);
			return NVML_ERROR_UNKNOWN;
		}
		char line[1024];
		int lineno = 0;
		while (fgets(line, sizeof line, f)) {
			lineno++;
			char *hash = strchr(line, '#');
			if (hash) *hash = 0;
			char *s = trim(line);
			if (!*s) continue;
			char *key = s, *val = s;
			while (*val && !isspace((unsigned char)*val)) val++;
			if (*val) *val++ = 0;
			val = trim(val);
			int rc = 0;
			if (!strcmp(key, "gpus")) {
				if (pass == 0) { ngpus = atoi(val); if (ngpus < 0 || ngpus > MAX_GPUS) rc = -2; }
			} else if (!strcmp(key, "epoch_us")) {
				if (pass == 0) epoch_us = atoll(val);
			} else if (!strcmp(key, "driver_version")) {
				if (pass == 0) snprintf(driver_version, sizeof driver_version, "%s", val);
			} else if (!strcmp(key, "procs_file")) {
				if (pass == 0) snprintf(procs_file, sizeof procs_file, "%s", val);
			} else if (!strcmp(key, "mig")) {
				if (pass == 0) {
					struct mig m;
					if (nmigs >= MAX_MIGS || sscanf(val, "%d %u %u %u %95s", &m.gpu, &m.gi, &m.ci, &m.slices, m.uuid) != 5 ||
					    m.gpu < 0 || m.gpu >= MAX_GPUS || m.slices == 0)
						rc = -2;
					else {
						migs[nmigs] = m;
						migdevs[nmigs].index = nmigs;
						gis[nmigs].mig = nmigs;
						nmigs++;
					}
				}
			} else if (pass == 1 && !strncmp(key, "gpu", 3) && isdigit((unsigned char)key[3])) {
				char *dot;
				long i = strtol(key + 3, &dot, 10);
				if (*dot != '.' || i < 0 || i >= MAX_GPUS) rc = -1;
				else rc = fn_gpu_set(&devs[i].g, dot + 1, val);
			} else if (pass == 1) {
				for (int i = 0; i < MAX_GPUS && rc == 0; i++)
					rc = fn_gpu_set(&devs[i].g, key, val);
			}
			if (rc) {
				fprintf(stderr, "fakenvml: %s:%d: %s %s: %s\n", path, lineno, key, val,
					rc == -1 ? "unknown key" : "bad value");
				fclose(f);
				return NVML_ERROR_UNKNOWN;
			}
		}
		fclose(f);
	}
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void)
{
	/* re-read on every first Init, so one loaded library serves many configs */
	if (init_count == 0) {
		nvmlReturn_t r = configure();
		if (r != NVML_SUCCESS) return r;
	}
	init_count++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	init_count--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_UNKNOWN: return "Unknown Error";
	default: return "Unknown Error";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!version || length < strlen(driver_version) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
	snprintf(version, length, "%s", driver_version);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	char v[80];
	snprintf(v, sizeof v, "12.%s", driver_version);
	if (!version || length < strlen(v) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
	snprintf(version, length, "%s", v);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!v) return NVML_ERROR_INVALID_ARGUMENT;
	*v = 12040;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!count) return NVML_ERROR_INVALID_ARGUMENT;
	*count = (unsigned)ngpus;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!device || index >= (unsigned)ngpus) return NVML_ERROR_INVALID_ARGUMENT;
	device->handle = &devs[index];
	return NVML_SUCCESS;
}

/* nvmlDevice_t wraps the pointer in a struct (go-nvml's nvml.h). */

/* check validates a handle and applies the GPU's injected faults at now. */
static nvmlReturn_t check(nvmlDevice_t d, int sensor)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (d.handle < devs || d.handle >= devs + ngpus) return NVML_ERROR_INVALID_ARGUMENT;
	double t = now_ms();
	if (d.handle->g.lost_at_ms >= 0 && t >= d.handle->g.lost_at_ms) return NVML_ERROR_GPU_IS_LOST;
	if (sensor && d.handle->g.unknown_from_ms >= 0 && t >= d.handle->g.unknown_from_ms && t < d.handle->g.unknown_to_ms)
		return NVML_ERROR_UNKNOWN;
	return NVML_SUCCESS;
}

#define CHECK(d, sensor) do { nvmlReturn_t _r = check(d, sensor); if (_r != NVML_SUCCESS) return _r; } while (0)

/* mig_of is the MIG device a handle names, or NULL for a GPU's handle. */
static struct mig *mig_of(nvmlDevice_t d)
{
	if (d.handle >= migdevs && d.handle < migdevs + nmigs) return &migs[d.handle - migdevs];
	return NULL;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
	struct mig *m = mig_of(d);
	if (m) {
		if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
		if (!uuid || length < strlen(m->uuid) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
		snprintf(uuid, length, "%s", m->uuid);
		return NVML_SUCCESS;
	}
	CHECK(d, 0);
	if (!uuid || length < strlen(d.handle->g.uuid) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
	snprintf(uuid, length, "%s", d.handle->g.uuid);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
	CHECK(d, 0);
	if (!name || length < strlen(d.handle->g.name) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
	snprintf(name, length, "%s", d.handle->g.name);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	CHECK(d, 0);
	if (!m) return NVML_ERROR_INVALID_ARGUMENT;
	m->total = d.handle->g.mem_total_mib << 20;
	m->used = d.handle->g.mem_used_mib << 20;
	m->free = m->total > m->used ? m->total - m->used : 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
	CHECK(d, 0);
	if (!u) return NVML_ERROR_INVALID_ARGUMENT;
	u->gpu = (unsigned)d.handle->g.util_pct;
	u->memory = (unsigned)d.handle->g.util_pct / 2;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *limit)
{
	CHECK(d, 0);
	if (!limit) return NVML_ERROR_INVALID_ARGUMENT;
	*limit = d.handle->g.power_limit_mw;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
	CHECK(d, 0);
	if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
	*mode = NVML_FEATURE_ENABLED;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
	CHECK(d, 0);
	if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
	*current = d.handle->g.mig_mode ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
	*pending = d.handle->g.mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
	return NVML_SUCCESS;
}

/* MIG: a GPU's MIG devices are the "mig" lines naming it, in file order. */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
	CHECK(d, 0);
	if (!count) return NVML_ERROR_INVALID_ARGUMENT;
	*count = 0;
	for (int k = 0; k < nmigs; k++)
		if (migs[k].gpu == d.handle->index) *count = 7;
	return *count ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig)
{
	CHECK(d, 0);
	if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int n = 0;
	for (int k = 0; k < nmigs; k++) {
		if (migs[k].gpu != d.handle->index) continue;
		if (n++ == index) {
			mig->handle = &migdevs[k];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
	struct mig *m = mig_of(d);
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!id) return NVML_ERROR_INVALID_ARGUMENT;
	if (!m) return NVML_ERROR_NOT_SUPPORTED;
	*id = m->gi;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
	struct mig *m = mig_of(d);
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!id) return NVML_ERROR_INVALID_ARGUMENT;
	if (!m) return NVML_ERROR_NOT_SUPPORTED;
	*id = m->ci;
	return NVML_SUCCESS;
}

/* GPU instance profiles: profile p has slice_counts[p] slices and id 100+p. */
static const unsigned int slice_counts[] = {1, 2, 3, 4, 7, 8, 6};
#define NPROFILES (int)(sizeof slice_counts / sizeof slice_counts[0])

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info)
{
	CHECK(d, 0);
	if (!info) return NVML_ERROR_INVALID_ARGUMENT;
	if (profile >= (unsigned)NPROFILES) return NVML_ERROR_NOT_SUPPORTED;
	memset(info, 0, sizeof *info);
	info->id = 100 + profile;
	info->sliceCount = slice_counts[profile];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *gi)
{
	CHECK(d, 0);
	if (!gi) return NVML_ERROR_INVALID_ARGUMENT;
	for (int k = 0; k < nmigs; k++) {
		if (migs[k].gpu == d.handle->index && migs[k].gi == id) {
			gi->handle = &gis[k];
			return NVML_SUCCESS;
		}
	}
	return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info)
{
	if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
	if (!info || gi.handle < gis || gi.handle >= gis + nmigs) return NVML_ERROR_INVALID_ARGUMENT;
	struct mig *m = &migs[gi.handle->mig];
	memset(info, 0, sizeof *info);
	info->device.handle = &devs[m->gpu];
	info->id = m->gi;
	info->profileId = 0; /* no profile: NOT_SUPPORTED below */
	for (int p = 0; p < NPROFILES; p++)
		if (slice_counts[p] == m->slices) info->profileId = 100 + p;
	return info->profileId ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* The 1 s average (GetPowerUsage, field 185) and the energy counter in NVML's
 * units. */
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *power)
{
	CHECK(d, 1);
	if (!d.handle->g.power_usage) return NVML_ERROR_NOT_SUPPORTED;
	if (!power) return NVML_ERROR_INVALID_ARGUMENT;
	*power = (unsigned)(fn_average_w(&d.handle->g, now_ms(), NULL) * 1000 + 0.5);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *energy)
{
	CHECK(d, 1);
	if (!d.handle->g.energy_call) return NVML_ERROR_NOT_SUPPORTED;
	if (!energy) return NVML_ERROR_INVALID_ARGUMENT;
	double j = fn_counter_j(&d.handle->g, now_ms(), NULL);
	*energy = (unsigned long long)(j * 1000);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values)
{
	CHECK(d, 1);
	if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
	double t = now_ms();
	for (int k = 0; k < count; k++) {
		nvmlFieldValue_t *f = &values[k];
		double v = 0, at = t;
		int ok = 1;
		switch (f->fieldId) {
		case NVML_FI_DEV_POWER_INSTANT:
			ok = d.handle->g.field_power;
			if (ok) v = fn_instant_w(&d.handle->g, t, &at) * 1000;
			break;
		case NVML_FI_DEV_POWER_AVERAGE:
			ok = d.handle->g.field_average;
			if (ok) v = fn_average_w(&d.handle->g, t, &at) * 1000;
			break;
		case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
			ok = d.handle->g.field_energy;
			if (ok) v = fn_counter_j(&d.handle->g, t, &at) * 1000;
			break;
		default:
			ok = 0;
		}
		f->latencyUsec = 0;
		if (!ok) {
			f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
			f->timestamp = 0;
			continue;
		}
		f->nvmlReturn = NVML_SUCCESS;
		f->timestamp = epoch_us + (long long)(at * 1000);
		if (f->fieldId == NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION) {
			f->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
			f->value.ullVal = (unsigned long long)(v < 0 ? 0 : v);
		} else {
			f->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
			f->value.uiVal = (unsigned int)(v < 0 ? 0 : v + 0.5);
		}
	}
	return NVML_SUCCESS;
}

/* read_procs fills up to max entries of GPU index from procs_file. */
static int read_procs(int index, unsigned int *pid, unsigned long long *mib, unsigned int *sm,
	unsigned int *gi, unsigned int *ci, int max)
{
	if (!procs_file[0]) return 0;
	FILE *f = fopen(procs_file, "r");
	if (!f) return 0;
	int n = 0;
	int g;
	unsigned int p, s, i, c;
	unsigned long long m;
	char line[256];
	while (fgets(line, sizeof line, f)) {
		int got = sscanf(line, "%d %u %llu %u %u %u", &g, &p, &m, &s, &i, &c);
		if (got < 4 || g != index) continue;
		if (got < 6) i = c = 0xFFFFFFFF;
		if (n < max) { pid[n] = p; mib[n] = m; sm[n] = s; gi[n] = i; ci[n] = c; }
		n++;
	}
	fclose(f);
	return n;
}

#define MAX_PROCS 64

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos)
{
	CHECK(d, 0);
	if (!count) return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int pid[MAX_PROCS], sm[MAX_PROCS], gi[MAX_PROCS], ci[MAX_PROCS];
	unsigned long long mib[MAX_PROCS];
	int n = read_procs(d.handle->index, pid, mib, sm, gi, ci, MAX_PROCS);
	if (n > MAX_PROCS) n = MAX_PROCS;
	if ((unsigned)n > *count) { *count = (unsigned)n; return NVML_ERROR_INSUFFICIENT_SIZE; }
	for (int k = 0; k < n; k++) {
		infos[k].pid = pid[k];
		infos[k].usedGpuMemory = mib[k] << 20;
		infos[k].gpuInstanceId = gi[k];
		infos[k].computeInstanceId = ci[k];
	}
	*count = (unsigned)n;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *u,
	unsigned int *count, unsigned long long lastSeen)
{
	(void)lastSeen;
	CHECK(d, 0);
	if (!count) return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int pid[MAX_PROCS], sm[MAX_PROCS], gi[MAX_PROCS], ci[MAX_PROCS];
	unsigned long long mib[MAX_PROCS];
	int n = read_procs(d.handle->index, pid, mib, sm, gi, ci, MAX_PROCS);
	if (n > MAX_PROCS) n = MAX_PROCS;
	if (!u || (unsigned)n > *count) { *count = (unsigned)n; return NVML_ERROR_INSUFFICIENT_SIZE; }
	for (int k = 0; k < n; k++) {
		u[k].pid = pid[k];
		u[k].timeStamp = (unsigned long long)now_us();
		u[k].smUtil = sm[k];
		u[k].memUtil = sm[k] / 2;
		u[k].encUtil = u[k].decUtil = 0;
	}
	*count = (unsigned)n;
	return NVML_SUCCESS;
}
