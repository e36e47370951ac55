#!/bin/bash
# Attribution on a real NVIDIA GPU: a PyTorch load that never speaks to the agent
# (scripts/gpu_plain_load.py) runs for 30 s; the agent, listing GPU 0's compute
# processes through NVML, must book it to a run of its Linux user
# (attribution: process), and idle only the time with no process. Needs the
# agent and collector in $BIN (default bin/) and a free 127.0.0.1:7433. Writes
# $OUT/attribution.txt and the JSON answers beside it.
set -u
cd "$(dirname "$0")/.."
: "${OUT:=$PWD/.gpucheck}"; mkdir -p "$OUT"
B=${BIN:-$PWD/bin}; D=/tmp/tma; rm -rf $D; mkdir -p $D
exec > >(tee $OUT/attribution.txt) 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$B/trainmeter serve --listen 127.0.0.1:7433 --data $D/data --gpu-price-per-hour 2.50 > $D/collector.log 2>&1 &
CP=$!
sleep 1
$B/trainmeter-agent --gpu nvml --collector 127.0.0.1:7433 --socket $D/agent.sock --spool $D/spool --node gpu0 > $D/agent.log 2>&1 &
AP=$!
sleep 5
$B/trainmeter-agent doctor --gpu nvml --socket $D/agent.sock --spool $D/dspool --collector 127.0.0.1:7433 2>&1 | grep -iA8 attribution
timeout 90 python3 scripts/gpu_plain_load.py 30 > $OUT/plain_load.json; echo load rc=$?; cat $OUT/plain_load.json
sleep 6
export TRAINMETER_COLLECTOR=127.0.0.1:7433
$B/trainmeter runs
$B/trainmeter runs --json > $OUT/attr_runs.json
for r in $($B/trainmeter runs --json | python3 -c 'import json,sys; [print(r["run_id"]) for r in json.load(sys.stdin).get("runs", [])]'); do $B/trainmeter report "$r"; done
$B/trainmeter usage --by user --since 1h
$B/trainmeter usage --by user --since 1h --json > $OUT/attr_usage.json
kill $AP; wait $AP; kill $CP; wait $CP
tail -c 6000 $D/agent.log
echo done
