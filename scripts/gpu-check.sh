#!/bin/bash
# The real agent on a real NVIDIA GPU: doctor, validate (idle and under load), one run of a
# bursty bf16 matmul load (scripts/gpu_load.py, PyTorch and nvidia-ml-py), its report and
# the node's usage, beside the NVML energy counter and a 10 ms power integral read by the
# load itself. Needs `make build` (bin/) and a free 127.0.0.1:7433. Writes $OUT/log.txt
# and $OUT/gpucheck.tgz (every JSON/CSV answer); docs/accuracy.md says what to compare.
set -u
cd "$(dirname "$0")/.."
: "${OUT:=$PWD/.gpucheck}"; mkdir -p "$OUT"
B=${BIN:-$PWD/bin}; D=/tmp/tm; rm -rf $D; mkdir -p $D
FINAL=$OUT; OUT=/tmp/res; rm -rf $OUT; mkdir -p $OUT
exec > >(tee $FINAL/log.txt) 2>&1
date -u; uname -r
nvidia-smi --query-gpu=name,driver_version,power.limit,power.draw,temperature.gpu,clocks.sm --format=csv
python3 -c "import torch;print('torch', torch.__version__, torch.cuda.get_device_name(0))"
$B/trainmeter-agent doctor --gpu nvml --socket $D/agent.sock --spool $D/spool --collector 127.0.0.1:7433 > $OUT/doctor.txt 2>&1; echo doctor rc=$?
$B/trainmeter-agent validate --duration 20s --json > $OUT/validate_idle.json 2>$D/vi.err; echo validate idle rc=$?; head -c 600 $D/vi.err
$B/trainmeter serve --listen 127.0.0.1:7433 --data $D/data --gpu-price-per-hour 2.50 --energy-price-kwh 0.15 --grid-gco2-kwh 400 > $D/collector.log 2>&1 &
CP=$!
sleep 1
$B/trainmeter-agent --gpu nvml --collector 127.0.0.1:7433 --socket $D/agent.sock --spool $D/spool --node h100 --warmup 10s --status-listen 127.0.0.1:9466 > $D/agent.log 2>&1 &
AP=$!
for i in $(seq 100); do [ -S $D/agent.sock ] && break; sleep 0.1; done
sleep 5
$B/trainmeter-agent validate --duration 60s --json > $OUT/validate_load.json 2>$D/vl.err &
VP=$!
PYTHONUNBUFFERED=1 timeout 150 python3 scripts/gpu_load.py $D/agent.sock h100-burst 80 > $OUT/load.json; echo load rc=$?
cat $OUT/load.json
wait $VP; echo validate load rc=$?
sleep 8
export TRAINMETER_COLLECTOR=127.0.0.1:7433
$B/trainmeter runs
$B/trainmeter report h100-burst
$B/trainmeter report h100-burst --json > $OUT/report.json
$B/trainmeter usage --since 1h
$B/trainmeter usage --since 1h --json > $OUT/usage.json
$B/trainmeter nodes
$B/trainmeter export csv --out $OUT/runs.csv
curl -s -m 10 127.0.0.1:9466/status > $OUT/agent_status.json
# A bare `wait` would also wait for the tee above, which ends only with this script.
kill $AP; wait $AP; kill $CP; wait $CP
tail -c 20000 $D/agent.log > $OUT/agent.log; tail -c 8000 $D/collector.log > $OUT/collector.log
tar czf $FINAL/gpucheck.tgz -C /tmp res
echo done
