#include "sensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fn_gpu_defaults(fn_gpu *g, int index)
{
	memset(g, 0, sizeof *g);
	snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
	snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e0000-0000-4000-8000-%012d", index);
	g->mem_total_mib = 81559;
	g->mem_used_mib = 1024;
	g->power_limit_mw = 700000;
	g->util_pct = 90;
	g->field_power = g->field_energy = g->field_average = g->power_usage = g->energy_call = 1;
	g->workload = FN_CONSTANT;
	g->idle_w = 70;
	g->low_w = 150;
	g->high_w = 300;
	g->freq_hz = 10;
	g->duty = 0.5;
	g->step_ms = 5000;
	g->burst_every_ms = 2000;
	g->burst_ms = 30;
	g->seed = 1 + (unsigned)index;
	fn_preset(g, "ampere");
	g->gain = 1;
	g->energy_offset_mj = 123456789;
	g->lost_at_ms = g->unknown_from_ms = g->unknown_to_ms = g->reset_at_ms = g->stale_from_ms = -1;
}

int fn_preset(fn_gpu *g, const char *name)
{
	if (!strcmp(name, "ampere")) { /* A100/H100: 25 ms seen of every 100 ms (Yang et al., SC24) */
		g->update_ms = 100; g->window_ms = 25; g->average_ms = 1000; g->energy_sampled = 0;
	} else if (!strcmp(name, "ampere-sampled")) { /* the same, counter built from the sampled windows */
		g->update_ms = 100; g->window_ms = 25; g->average_ms = 1000; g->energy_sampled = 1;
	} else if (!strcmp(name, "ideal")) { /* a sensor that sees all of every period */
		g->update_ms = 100; g->window_ms = 100; g->average_ms = 1000; g->energy_sampled = 0;
	} else if (!strcmp(name, "volta")) { /* V100: GetPowerUsage is close to instant */
		g->update_ms = 20; g->window_ms = 20; g->average_ms = 20; g->energy_sampled = 0;
	} else {
		return -1;
	}
	g->nckpt = 0; g->sampled_k = 0; g->sampled_j = 0;
	return 0;
}

static int parse_double(const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || !isfinite(v))
		return -2;
	while (*end == ' ' || *end == '\t') end++;
	if (*end) return -2;
	*out = v;
	return 0;
}

int fn_gpu_set(fn_gpu *g, const char *key, const char *val)
{
	double v = 0;
	int num = parse_double(val, &v);
	g->nckpt = 0; g->sampled_k = 0; g->sampled_j = 0;
#define STR(k, f) if (!strcmp(key, k)) { snprintf(g->f, sizeof g->f, "%s", val); return 0; }
#define NUM(k, f, T) if (!strcmp(key, k)) { if (num) return num; g->f = (T)v; return 0; }
	STR("name", name)
	STR("uuid", uuid)
	NUM("mem_total_mib", mem_total_mib, unsigned long long)
	NUM("mem_used_mib", mem_used_mib, unsigned long long)
	if (!strcmp(key, "power_limit_w")) { if (num) return num; g->power_limit_mw = (unsigned)(v * 1000); return 0; }
	NUM("mig", mig_mode, int)
	NUM("mig_pending", mig_pending, int)
	NUM("util_pct", util_pct, int)
	NUM("field_power", field_power, int)
	NUM("field_energy", field_energy, int)
	NUM("field_average", field_average, int)
	NUM("power_usage", power_usage, int)
	NUM("energy_call", energy_call, int)
	if (!strcmp(key, "workload")) {
		if (!strcmp(val, "constant")) g->workload = FN_CONSTANT;
		else if (!strcmp(val, "steps")) g->workload = FN_STEPS;
		else if (!strcmp(val, "square")) g->workload = FN_SQUARE;
		else if (!strcmp(val, "bursts")) g->workload = FN_BURSTS;
		else return -2;
		return 0;
	}
	if (!strcmp(key, "sensor")) return fn_preset(g, val) ? -2 : 0;
	NUM("idle_w", idle_w, double)
	NUM("low_w", low_w, double)
	NUM("high_w", high_w, double)
	NUM("freq_hz", freq_hz, double)
	NUM("duty", duty, double)
	NUM("phase_ms", phase_ms, double)
	NUM("step_ms", step_ms, long)
	NUM("stall_every_ms", stall_every_ms, long)
	NUM("stall_ms", stall_ms, long)
	NUM("burst_every_ms", burst_every_ms, long)
	NUM("burst_ms", burst_ms, long)
	NUM("seed", seed, unsigned int)
	NUM("update_ms", update_ms, long)
	NUM("window_ms", window_ms, long)
	NUM("average_ms", average_ms, long)
	NUM("energy_sampled", energy_sampled, int)
	NUM("gain", gain, double)
	NUM("energy_offset_mj", energy_offset_mj, long)
	NUM("lost_at_ms", lost_at_ms, double)
	NUM("unknown_from_ms", unknown_from_ms, double)
	NUM("unknown_to_ms", unknown_to_ms, double)
	NUM("reset_at_ms", reset_at_ms, double)
	NUM("stale_from_ms", stale_from_ms, double)
#undef STR
#undef NUM
	return -1;
}

static unsigned int hash32(unsigned int x)
{
	x ^= x >> 16; x *= 0x7feb352dU;
	x ^= x >> 15; x *= 0x846ca68bU;
	x ^= x >> 16;
	return x;
}

double fn_true_power_w(const fn_gpu *g, long ms)
{
	if (ms < 0)
		return g->idle_w;
	switch (g->workload) {
	case FN_CONSTANT:
		return g->high_w;
	case FN_STEPS:
		return g->step_ms > 0 && (ms / g->step_ms) % 2 ? g->low_w : g->high_w;
	case FN_SQUARE: {
		if (g->stall_every_ms > g->stall_ms && g->stall_ms > 0) {
			long n = ms / g->stall_every_ms, off = ms % g->stall_every_ms;
			long start = (long)(hash32(g->seed * 2654435761U + (unsigned)n) % (unsigned)(g->stall_every_ms - g->stall_ms));
			if (off >= start && off < start + g->stall_ms)
				return g->idle_w;
		}
		double period = 1000.0 / g->freq_hz;
		double ph = fmod((double)ms + g->phase_ms, period) / period;
		return ph < g->duty ? g->high_w : g->low_w;
	}
	case FN_BURSTS: {
		long every = g->burst_every_ms > 0 ? g->burst_every_ms : 1;
		long off = (ms + (long)g->phase_ms) % every;
		return off < g->burst_ms ? g->high_w : g->low_w;
	}
	}
	return g->idle_w;
}

double fn_true_energy_j(fn_gpu *g, double t_ms)
{
	if (t_ms <= 0)
		return t_ms * g->idle_w / 1000;
	long whole = (long)floor(t_ms);
	long c = whole / 1000;
	if (c >= FN_CKPTS)
		c = FN_CKPTS - 1;
	if (g->nckpt == 0) {
		g->ckpt[0] = 0;
		g->nckpt = 1;
	}
	for (; g->nckpt <= c; g->nckpt++) {
		double sum = g->ckpt[g->nckpt - 1];
		for (long i = (g->nckpt - 1) * 1000; i < g->nckpt * 1000; i++)
			sum += fn_true_power_w(g, i) / 1000;
		g->ckpt[g->nckpt] = sum;
	}
	double sum = g->ckpt[c];
	for (long i = c * 1000; i < whole; i++)
		sum += fn_true_power_w(g, i) / 1000;
	return sum + (t_ms - whole) * fn_true_power_w(g, whole) / 1000;
}

/* last_update is the time of the sensor's last update at or before t_ms. */
static double last_update(const fn_gpu *g, double t_ms)
{
	double t = t_ms;
	if (g->stale_from_ms >= 0 && t > g->stale_from_ms)
		t = g->stale_from_ms;
	return floor(t / g->update_ms) * g->update_ms;
}

static double window_mean_w(fn_gpu *g, double end_ms)
{
	double b = fn_true_energy_j(g, end_ms), a = fn_true_energy_j(g, end_ms - g->window_ms);
	return (b - a) / g->window_ms * 1000;
}

double fn_instant_w(fn_gpu *g, double t_ms, double *at_ms)
{
	double u = last_update(g, t_ms);
	if (at_ms) *at_ms = u;
	return g->gain * window_mean_w(g, u);
}

double fn_average_w(fn_gpu *g, double t_ms, double *at_ms)
{
	double u = last_update(g, t_ms);
	if (at_ms) *at_ms = u;
	long n = g->average_ms / g->update_ms;
	if (n < 1) n = 1;
	double sum = 0;
	for (long k = 0; k < n; k++)
		sum += window_mean_w(g, u - k * g->update_ms);
	return g->gain * sum / n;
}

/* raw_counter_j is the counter at update time u (a multiple of update_ms),
 * without the offset or any reset. */
static double raw_counter_j(fn_gpu *g, double u)
{
	if (!g->energy_sampled)
		return fn_true_energy_j(g, u);
	long k = (long)llround(u / g->update_ms);
	if (k < g->sampled_k) {
		g->sampled_k = 0;
		g->sampled_j = 0;
	}
	for (; g->sampled_k < k; g->sampled_k++)
		g->sampled_j += window_mean_w(g, (double)(g->sampled_k + 1) * g->update_ms) * g->update_ms / 1000;
	return g->sampled_j;
}

double fn_counter_j(fn_gpu *g, double t_ms, double *at_ms)
{
	double u = last_update(g, t_ms);
	if (at_ms) *at_ms = u;
	double c = raw_counter_j(g, u);
	if (g->reset_at_ms >= 0 && u >= g->reset_at_ms) {
		/* a driver reload: the counter restarts at zero at the first update after it */
		double r = ceil(g->reset_at_ms / g->update_ms) * g->update_ms;
		return g->gain * (c - raw_counter_j(g, r));
	}
	return g->gain * c + g->energy_offset_mj / 1000.0;
}
