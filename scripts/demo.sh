#!/usr/bin/env bash
# make demo: a collector and an agent with two simulated GPUs on this machine,
# two training runs that differ (backend bnb vs unsloth), then the runs table,
# one report and the CSV. No root; everything lives in .demo/. The collector and
# the agent are stopped at the end, unless KEEP=1 (make demo KEEP=1): then they
# keep running for you to explore, and the last lines say how to stop them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DEMO=${DEMO_DIR:-.demo}
DURATION=${DEMO_DURATION_S:-10}
rm -rf "$DEMO" && mkdir -p "$DEMO"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ADDR=127.0.0.1:$PORT
UI_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
UI=127.0.0.1:$UI_PORT
SOCK=$PWD/$DEMO/agent.sock
export TRAINMETER_COLLECTOR=$ADDR

KEEP=${KEEP:-0}
pids=()
kept=0
cleanup() {
	[ "$kept" = 1 ] && return
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

echo "==> collector on $ADDR, web console on http://$UI/ (data in $DEMO/data)"
PRICES=(--gpu-price-per-hour 2.10 --energy-price-kwh 0.15 --grid-gco2-kwh 400)
"$BIN/trainmeter" serve --listen "$ADDR" --ui-listen "$UI" --data "$DEMO/data" "${PRICES[@]}" >"$DEMO/collector.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do "$BIN/trainmeter" nodes >/dev/null 2>&1 && break; sleep 0.1; done

echo "==> agent with two simulated GPUs (--gpu sim:2), warmup 2s"
"$BIN/trainmeter-agent" --collector "$ADDR" --socket "$SOCK" --node demo-node --gpu sim:2 \
	--warmup 2s --spool "$DEMO/spool" >"$DEMO/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "agent did not open $SOCK"; cat "$DEMO/agent.log"; exit 1; }

# Two runs cost about $0.024: this budget alerts at 50, 75, 90 and 100 %.
"$BIN/trainmeter" budget set model:llama-3-8b 0.02

train() {
	python3 clients/python/examples/train_sim.py --socket "$SOCK" --gpus 0,1 --duration-s "$DURATION" \
		--model llama-3-8b --dataset sft-demo --optimizer adamw_torch --batch-size 8 --grad-accum 4 \
		--seq-len 2048 --precision bf16 --seed 42 --epochs 2 "$@"
}
echo "==> run demo-bnb: backend bnb, 4-bit, slower"
train --run-id demo-bnb --backend bnb --notes "qlora 4-bit" --tokens-per-s 18000 --step-time 0.2 --data-wait-frac 0.25
echo "==> run demo-unsloth: backend unsloth, faster"
train --run-id demo-unsloth --backend unsloth --notes "lora r=32" --tokens-per-s 32000 --step-time 0.2 --data-wait-frac 0.05

# The agent closes a run's last window about 1.3 s after run_end.
for _ in $(seq 50); do
	n=$("$BIN/trainmeter" export csv | awk -F, 'NR>1 && $0 ~ /,ended,|ended/' | wc -l)
	[ "$n" -ge 2 ] && break; sleep 0.2
done
echo
"$BIN/trainmeter" runs
echo
"$BIN/trainmeter" summary
echo
"$BIN/trainmeter" report demo-unsloth
echo
"$BIN/trainmeter" budget
"$BIN/trainmeter" alerts
"$BIN/trainmeter" forecast llama-3-8b 10
"$BIN/trainmeter" export csv --out "$DEMO/runs.csv"
echo
echo "==> CSV written to $DEMO/runs.csv"
if command -v column >/dev/null; then column -s, -t <"$DEMO/runs.csv" | cut -c1-160; else cut -d, -f1-12 "$DEMO/runs.csv"; fi
echo
# The console answers (the runs page lists both runs) before its address is printed.
python3 - "$UI" <<'PY' || { echo "the web console at http://$UI/ does not answer"; tail -5 "$DEMO/collector.log"; exit 1; }
import sys, urllib.request
page = urllib.request.urlopen("http://%s/runs" % sys.argv[1], timeout=10).read().decode()
sys.exit(0 if "demo-bnb" in page and "demo-unsloth" in page else 1)
PY
if [ "$KEEP" = 1 ]; then
	kept=1
	cat <<EOT
==> the collector (pid ${pids[0]}, $ADDR) and the agent (pid ${pids[1]}, socket $SOCK) keep running. Explore:
    export TRAINMETER_COLLECTOR=$ADDR
    $BIN/trainmeter runs --json | less; $BIN/trainmeter report demo-bnb; $BIN/trainmeter recommend; $BIN/trainmeter nodes
    $BIN/trainmeter run --socket $SOCK --model my-model --label team=demo -- sleep 5   # measure any command
    python3 clients/python/examples/train_sim.py --socket $SOCK --run-id my-run --duration-s 20
  stop them with: kill ${pids[0]} ${pids[1]}   (data stays in $DEMO/)
==> web console: http://$UI/   (Runs, a run's charts, Compare, Budgets, Prices, Recommendations, Nodes; docs/console.md)
EOT
else
	cat <<EOT
==> demo done: the collector and the agent are stopped now; the data stays in $DEMO/data.
    To keep exploring: make demo KEEP=1 leaves both running and prints what to try, or restart the collector on this data:
    $BIN/trainmeter serve --data $DEMO/data --listen $ADDR --ui-listen $UI ${PRICES[*]} &   then   TRAINMETER_COLLECTOR=$ADDR $BIN/trainmeter runs
==> web console: http://$UI/   (served by that collector: make demo KEEP=1, or the command above; docs/console.md)
EOT
fi
