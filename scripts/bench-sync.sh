#!/usr/bin/env bash
# Measures `acp-host sync` on N definitions x every sync agent (default 1000), in a throwaway $HOME:
# a first sync (creates everything, one shared DSH file with N items), a second one (all no-op),
# one after every body changed (N updates per agent, the DSH file rewritten once), and a first
# sync into a fresh $HOME while another process keeps writing to the same filesystem.
# Usage: scripts/bench-sync.sh [N...]     e.g. scripts/bench-sync.sh 1000 2000
#   AGENTS=5        the five agents of the goal (claude-code, codex, opencode, github-copilot, dsh)
#                   instead of all eight
#   ACP_HOST_BASE   another acp-host build, measured beside this one: each step runs with one
#                   build, then the other (a ratio on one load; the shared machine's disk varies
#                   from minute to minute), the order swapped every round
#   ROUNDS=1        how many rounds per N
#   LOAD_MB=512     the concurrent writer: `dd` rewriting a LOAD_MB file in a loop beside the
#                   $HOME (dirty pages a `syncfs` would have to flush); 0 skips that figure
# Trees are removed only at the end: on a filesystem without a journal (ext4 without one checks
# every recently deleted inode before reusing it), removing thousands of files slows the file
# creation of the runs that follow for a minute or more, which would bias whichever build ran
# second.
# The reference (Aikito) takes about 13 s per sync at 1,000 definitions x 5 agents.
set -euo pipefail
cd "$(dirname "$0")/.."
# The release build of the whole workspace: the acp-host that ships, laid out by
# acp-host-cli/startup-order.txt (whose names depend on which packages a build selects).
cargo build --release -q --workspace
bins=("$PWD/target/release/acp-host")
[[ -n ${ACP_HOST_BASE:-} ]] && bins+=("$ACP_HOST_BASE")
agents='claude-code, codex, opencode, github-copilot, agy, grok, pi, dsh'
count=8
if [[ ${AGENTS:-8} == 5 ]]; then
  agents='claude-code, codex, opencode, github-copilot, dsh'
  count=5
fi
rounds=${ROUNDS:-1}
load_mb=${LOAD_MB:-512}

scratch=$(mktemp -d)
writer=
cleanup() {
  [[ -n $writer ]] && kill "$writer" 2>/dev/null && wait "$writer" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT

seconds() { # runs "$@", prints elapsed wall seconds
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

tree() { # tree DIR: a fresh $HOME and project under DIR
  mkdir -p "$1/home" "$1/project/subagents"
  for dir in .claude .codex .config/opencode .copilot .gemini/config .grok .pi .dsh; do
    mkdir -p "$1/home/$dir"
  done
  mkdir -p "$1/home/.pi/agent/extensions/subagent" && : >"$1/home/.pi/agent/extensions/subagent/index.ts"
}

write_defs() { # write_defs DIR N BODY
  for i in $(seq 1 "$2"); do
    printf -- '---\ndescription: "subagent %s"\nagents: [%s]\ndsh: {model: "m", maxTokens: 4096}\n---\n\n%s body %s.\n\nSecond paragraph.\n' \
      "$i" "$agents" "$3" "$i" >"$1/project/subagents/agent-$i.md"
  done
}

sync_in() { # sync_in DIR BIN
  (cd "$1/project" && env -i HOME="$1/home" PATH=/usr/bin:/bin XDG_STATE_HOME="$1/state" "$2" sync)
}

start_writer() {
  (while :; do dd if=/dev/zero of="$scratch/load" bs=1M count="$load_mb" conv=notrunc status=none; done) &
  writer=$!
  sleep 2 # let dirty pages pile up
}

stop_writer() {
  kill "$writer" 2>/dev/null
  wait "$writer" 2>/dev/null || true
  writer=
}

for n in "${@:-1000}"; do
for round in $(seq 1 "$rounds"); do
  order=("${bins[@]}")
  if ((round % 2 == 0)) && ((${#bins[@]} == 2)); then order=("${bins[1]}" "${bins[0]}"); fi
  declare -A create=() noop=() update=() loaded=() files=()
  for k in "${!order[@]}"; do
    tree "$scratch/$n-$round-$k"
    write_defs "$scratch/$n-$round-$k" "$n" First
  done
  for k in "${!order[@]}"; do create[$k]=$(seconds sync_in "$scratch/$n-$round-$k" "${order[$k]}"); done
  for k in "${!order[@]}"; do noop[$k]=$(seconds sync_in "$scratch/$n-$round-$k" "${order[$k]}"); done
  for k in "${!order[@]}"; do
    files[$k]=$(find "$scratch/$n-$round-$k/home" -path "$scratch/$n-$round-$k/home/.local" -prune -o -type f -print | wc -l)
    write_defs "$scratch/$n-$round-$k" "$n" Changed
  done
  for k in "${!order[@]}"; do update[$k]=$(seconds sync_in "$scratch/$n-$round-$k" "${order[$k]}"); done
  if ((load_mb > 0)); then
    for k in "${!order[@]}"; do
      tree "$scratch/$n-$round-$k-load"
      write_defs "$scratch/$n-$round-$k-load" "$n" First
    done
    start_writer
    for k in "${!order[@]}"; do loaded[$k]=$(seconds sync_in "$scratch/$n-$round-$k-load" "${order[$k]}"); done
    dirty=$(awk '/^Dirty:/ {printf "%d", $2 / 1024}' /proc/meminfo 2>/dev/null || echo '?')
    stop_writer
  fi
  for k in "${!order[@]}"; do
    line="${order[$k]} n=$n agents=$count files=${files[$k]}: create ${create[$k]}s, no-op ${noop[$k]}s, update ${update[$k]}s"
    ((load_mb > 0)) && line+=", create with a concurrent writer ${loaded[$k]}s (${load_mb} MB rewritten in a loop, ${dirty} MB dirty)"
    echo "$line"
  done
done
done
