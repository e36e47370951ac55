#!/usr/bin/env bash
# Server reflection works for a real client: grpcurl lists both services.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
bin/trainmeter serve --listen 127.0.0.1:$PORT --data "$tmp/data" >"$tmp/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do bin/trainmeter nodes --collector 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 0.1; done
out=$(go tool -modfile=tools/go.mod grpcurl -plaintext 127.0.0.1:$PORT list)
echo "$out"
for svc in trainmeter.v1.IngestService trainmeter.v1.QueryService trainmeter.v1.BudgetService trainmeter.v1.PriceService grpc.reflection.v1.ServerReflection; do
	grep -qx "$svc" <<<"$out" || { echo "grpcurl-check: $svc not listed"; exit 1; }
done
go tool -modfile=tools/go.mod grpcurl -plaintext -d '{}' 127.0.0.1:$PORT trainmeter.v1.QueryService/ListRuns >/dev/null
# The timeline API answers grpcurl too (docs/console.md): NotFound for a run it does not know.
tl=$(go tool -modfile=tools/go.mod grpcurl -plaintext -d '{"run_id": "no-such-run", "max_points": 500}' 127.0.0.1:$PORT trainmeter.v1.QueryService/Timeline 2>&1 || true)
grep -q 'NotFound' <<<"$tl" || { echo "grpcurl-check: Timeline: $tl"; exit 1; }
echo "grpcurl-check: ok"
