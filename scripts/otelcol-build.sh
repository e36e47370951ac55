#!/usr/bin/env bash
# Builds the OpenTelemetry Collector distribution described by
# deploy/otelcol/builder-config.yaml with the official builder and prints the
# path of the binary on stdout (all progress goes to stderr).
#
# The result is cached under
#   ${TRAINMETER_CACHE:-$HOME/.cache/trainmeter}/otelcol-<key>/otelcol-trainmeter
# where <key> hashes the manifest, this script, the builder version and
# `go version`, so a second call returns at once and a changed manifest,
# build recipe or toolchain rebuilds. Safe to run concurrently: builds of
# one key are serialised with flock, and the binary appears in the cache only
# once it is complete (rename).
#
# --cached-only: print the path if the binary is already built, else exit 3
# without building (tests use it to find a collector without a long build);
# it needs neither flock nor the network.
set -euo pipefail

cached_only=false
case "${1:-}" in
--cached-only) cached_only=true ;;
"") ;;
*) echo "usage: $0 [--cached-only]" >&2; exit 2 ;;
esac

BUILDER_VERSION=v0.162.0
root=$(cd "$(dirname "$0")/.." && pwd)
manifest=$root/deploy/otelcol/builder-config.yaml
cache=${TRAINMETER_CACHE:-$HOME/.cache/trainmeter}

command -v go >/dev/null || { echo "otelcol-build: go is not installed" >&2; exit 1; }
[ -f "$manifest" ] || { echo "otelcol-build: missing $manifest" >&2; exit 1; }

# The key covers everything that decides the binary: the manifest, this
# script (how it builds), the builder and the Go toolchain.
key=$( { cat "$manifest"; cat "$root/scripts/otelcol-build.sh"; echo "builder $BUILDER_VERSION"; go version; } | sha256sum | cut -c1-16)
dir=$cache/otelcol-$key
bin=$dir/otelcol-trainmeter

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi
if $cached_only; then
	exit 3
fi

command -v flock >/dev/null || { echo "otelcol-build: flock (util-linux) is not installed" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/otelcol-$key.lock"
flock 9
# Another caller may have finished the build while this one waited.
if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

# The builder itself, installed once per version next to the collectors.
builder_dir=$cache/otelcol-builder-$BUILDER_VERSION
builder=$builder_dir/builder
if [ ! -x "$builder" ]; then
	echo "otelcol-build: installing builder $BUILDER_VERSION" >&2
	GOBIN=$builder_dir go install "go.opentelemetry.io/collector/cmd/builder@$BUILDER_VERSION" >&2
fi

work=$(mktemp -d "$cache/otelcol-$key.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
sed "s|^\(  output_path:\).*|\1 $work/src|" "$manifest" >"$work/builder-config.yaml"

start=$(date +%s)
echo "otelcol-build: building the collector in $work (this downloads modules the first time)" >&2
# The generated module is not this repository's: plain GOFLAGS, static binary.
(cd "$work" && GOFLAGS=-buildvcs=false CGO_ENABLED=0 "$builder" --config "$work/builder-config.yaml") >&2
[ -x "$work/src/otelcol-trainmeter" ] || { echo "otelcol-build: the builder produced no binary" >&2; exit 1; }

mkdir -p "$dir"
cp "$manifest" "$dir/builder-config.yaml"
mv "$work/src/otelcol-trainmeter" "$dir/otelcol-trainmeter.tmp"
mv "$dir/otelcol-trainmeter.tmp" "$bin"
echo "otelcol-build: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
