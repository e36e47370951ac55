"""A bf16 matmul load on GPU 0 that never speaks to the agent (no trainmeter
client), with the NVML energy counter read around it: the agent must bill
it to this process's Linux user, not to idle (docs/attribution.md)."""
import json, sys, time
import pynvml, torch

dur = float(sys.argv[1])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h); t0 = time.time()
end_at = time.monotonic() + dur
while time.monotonic() < end_at:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
t1 = time.time(); e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
print(json.dumps({"t0": t0, "t1": t1, "counter_j": (e1 - e0) / 1000.0}))
