#!/usr/bin/env bash
# Measures what acp-host adds to one run: wall time of a full run (spawn, handshake, prompt,
# teardown) against the mock agent, and peak memory while relaying a large frame.
#
#   scripts/bench-run.sh [RUNS]        (default 50; builds release binaries first)
#
# Prints the mean and p95 wall time per run and the peak RSS of acp-host for an 8 MiB frame.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-50}
cargo build --release -q --workspace
host=target/release/acp-host
mock=target/release/mock-agent
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

times=()
for _ in $(seq "$runs"); do
  start=$(date +%s%N)
  "$host" run --agent "$mock hello" hi >/dev/null
  end=$(date +%s%N)
  times+=($(( (end - start) / 1000 )))
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
mean=$(printf '%s\n' "${times[@]}" | awk '{s+=$1} END {printf "%.1f", s/NR/1000}')
p95=$(echo "$sorted" | awk -v n="$runs" 'NR==int(n*0.95+0.5){printf "%.1f", $1/1000}')
echo "run (mock hello, $runs runs): mean ${mean} ms, p95 ${p95} ms"

/usr/bin/time -f '%M' -o "$work/rss" "$host" run --agent "$mock huge --bytes 8388608" hi >/dev/null
echo "peak RSS of acp-host relaying one 8 MiB frame: $(( $(cat "$work/rss") / 1024 )) MiB"
