/*
 * The sensor model of the fake NVML library: a ground-truth power trace at
 * 1 ms resolution and what NVIDIA's sensor makes of it. Every function takes
 * the time explicitly (ms since the trace's epoch), so the same code serves the
 * fake libnvidia-ml.so.1 (real clock) and the in-process accuracy study
 * (virtual clock, through cgo). docs/accuracy.md cites the behaviours.
 */
#ifndef FAKENVML_SENSOR_H
#define FAKENVML_SENSOR_H

enum fn_workload { FN_CONSTANT, FN_STEPS, FN_SQUARE, FN_BURSTS };

typedef struct fn_gpu {
	/* identity, as NVML reports it */
	char name[96];
	char uuid[96];
	unsigned long long mem_total_mib, mem_used_mib;
	unsigned int power_limit_mw;
	int mig_mode, mig_pending;
	int util_pct;

	/* which NVML calls answer (1) or return NOT_SUPPORTED (0) */
	int field_power, field_energy, field_average, power_usage, energy_call;

	/* ground truth: power in W as a function of the ms index */
	enum fn_workload workload;
	double idle_w, low_w, high_w;
	double freq_hz, duty, phase_ms;
	long step_ms;                     /* FN_STEPS: low/high alternate every step_ms */
	long stall_every_ms, stall_ms;    /* FN_SQUARE: a data stall at idle_w in every stall_every_ms */
	long burst_every_ms, burst_ms;    /* FN_BURSTS: high_w for burst_ms out of every burst_every_ms */
	unsigned int seed;

	/* the sensor */
	long update_ms;   /* the sensor (fields 186, 83) updates every update_ms */
	long window_ms;   /* field 186 is the mean over the last window_ms before an update */
	long average_ms;  /* GetPowerUsage / field 185: mean of the updates in the last average_ms */
	int energy_sampled; /* 0: the counter integrates the whole period; 1: window mean x period */
	double gain;      /* board gain: every reading is gain x truth */
	long energy_offset_mj; /* counter value at the epoch (energy since the driver loaded) */

	/* faults, in ms since the epoch; < 0: never */
	double lost_at_ms;
	double unknown_from_ms, unknown_to_ms;
	double reset_at_ms;
	double stale_from_ms; /* from then on the sensor stops updating (stuck fields) */

	/* caches (any query order is exact): ckpt[i] is the true energy over
	 * [0, i s), known for i < nckpt */
#define FN_CKPTS 7200
	double ckpt[FN_CKPTS];
	long nckpt;
	long sampled_k;
	double sampled_j;
} fn_gpu;

void fn_gpu_defaults(fn_gpu *g, int index);
/* fn_gpu_set sets one parameter from text; 0 on success, -1 for an unknown
 * key, -2 for a bad value. Parameter changes drop the caches. */
int fn_gpu_set(fn_gpu *g, const char *key, const char *val);
/* fn_preset applies a sensor preset ("ampere", "ideal", "volta"); -1 unknown. */
int fn_preset(fn_gpu *g, const char *name);

double fn_true_power_w(const fn_gpu *g, long ms);
/* fn_true_energy_j is the integral of the true power over [0, t_ms). */
double fn_true_energy_j(fn_gpu *g, double t_ms);

/* The readings at time t_ms. *at_ms is the sensor timestamp (the last update,
 * which only moves when the sensor updates). */
double fn_instant_w(fn_gpu *g, double t_ms, double *at_ms);
double fn_average_w(fn_gpu *g, double t_ms, double *at_ms);
double fn_counter_j(fn_gpu *g, double t_ms, double *at_ms);

#endif
