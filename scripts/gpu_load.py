"""A bursty bf16 matmul load on GPU 0 reported as one trainmeter run, with the
NVML energy counter and a 10 ms power integral read beside it as references."""
import json, os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
import pynvml, torch, trainmeter

sock, run_id, dur = sys.argv[1], sys.argv[2], float(sys.argv[3])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
stop = threading.Event()
integ = {"j": 0.0, "n": 0, "max_w": 0.0}

def poll():
    last = time.monotonic(); lastw = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
    while not stop.is_set():
        time.sleep(0.01)
        now = time.monotonic(); w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        integ["j"] += lastw * (now - last); integ["n"] += 1; integ["max_w"] = max(integ["max_w"], w)
        last, lastw = now, w

x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
th = threading.Thread(target=poll, daemon=True)
e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h); t0 = time.time(); th.start()
run = trainmeter.start(run_id=run_id, socket_path=sock, model="matmul-8192-bf16", batch_size=16, seq_len=2048,
                       precision="bf16", gpus=[pynvml.nvmlDeviceGetUUID(h)], warmup_s=10)
steps = tokens = 0
end_at = time.monotonic() + dur
while time.monotonic() < end_at:
    busy_until = time.monotonic() + 3.0
    while time.monotonic() < busy_until:
        s = time.monotonic()
        for _ in range(20):
            y = x @ x
        torch.cuda.synchronize()
        steps += 1; tokens += 16 * 2048
        run.step(tokens=16 * 2048, compute_s=time.monotonic() - s, data_wait_s=0.0)
    time.sleep(1.5)
run.end()
t1 = time.time(); e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h); stop.set(); th.join()
print(json.dumps({"run_id": run_id, "t_start": t0, "t_end": t1, "wall_s": t1 - t0, "steps": steps, "tokens": tokens,
                  "counter_delta_j": (e1 - e0) / 1000.0, "poll10ms_integral_j": integ["j"], "poll_reads": integ["n"],
                  "poll_max_w": integ["max_w"], "client_stats": run.stats()}, default=str))
