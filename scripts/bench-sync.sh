#!/usr/bin/env bash
# Measures `acp-host sync` on N definitions x every sync agent (default 1000), in a throwaway $HOME:
# a first sync (creates everything, one shared DSH file with N items), a second one (all no-op),
# and one after every body changed (N updates per agent, the DSH file rewritten once).
# Usage: scripts/bench-sync.sh [N...]     e.g. scripts/bench-sync.sh 1000 2000
#   AGENTS=5        the five agents of the goal (claude-code, codex, opencode, github-copilot, dsh)
#                   instead of all eight
#   ACP_HOST_BASE   another acp-host build, measured right after this one on each N (a ratio on
#                   one load; the shared machine's disk varies from minute to minute)
# The reference (Aikito) takes about 13 s per sync at 1,000 definitions x 5 agents.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p acp-host
bins=("$PWD/target/release/acp-host")
[[ -n ${ACP_HOST_BASE:-} ]] && bins+=("$ACP_HOST_BASE")
agents='claude-code, codex, opencode, github-copilot, agy, grok, pi, dsh'
count=8
if [[ ${AGENTS:-8} == 5 ]]; then
  agents='claude-code, codex, opencode, github-copilot, dsh'
  count=5
fi

seconds() { # runs "$@", prints elapsed wall seconds
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

for n in "${@:-1000}"; do
for bin in "${bins[@]}"; do
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/home" "$work/project/subagents"
  for dir in .claude .codex .config/opencode .copilot .gemini/config .grok .pi .dsh; do
    mkdir -p "$work/home/$dir"
  done
  mkdir -p "$work/home/.pi/agent/extensions/subagent" && : >"$work/home/.pi/agent/extensions/subagent/index.ts"
  write_defs() {
    for i in $(seq 1 "$n"); do
      printf -- '---\ndescription: "subagent %s"\nagents: [%s]\ndsh: {model: "m", maxTokens: 4096}\n---\n\n%s body %s.\n\nSecond paragraph.\n' \
        "$i" "$agents" "$1" "$i" >"$work/project/subagents/agent-$i.md"
    done
  }
  write_defs "First"
  run() { (cd "$work/project" && env -i HOME="$work/home" PATH=/usr/bin:/bin XDG_STATE_HOME="$work/state" "$bin" sync "$@"); }
  create=$(seconds run)
  noop=$(seconds run)
  write_defs "Changed"
  update=$(seconds run)
  files=$(find "$work/home" -path "$work/home/.local" -prune -o -type f -print | wc -l)
  echo "$bin n=$n agents=$count files=$files: create ${create}s, no-op ${noop}s, update ${update}s"
  rm -rf "$work"
  trap - EXIT
done
done
