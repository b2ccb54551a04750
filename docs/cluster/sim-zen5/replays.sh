#!/bin/bash
# The simulator's replays of the measured mixed-replica runs, each on its own VM kind's profile
# (Zen 3: sim-zen3-chunks; Zen 5: this folder's), and of the four multi-turn chats; prints the
# moves and the errors against each run. Run from the repository root; replay only (seconds).
set -euo pipefail
T=.venv/bin/tandem
TMP=$(mktemp -d)
Z3=$PWD/docs/cluster/sim-zen3-chunks/profile-smollm2-1t.json
Z5=$PWD/docs/cluster/sim-zen5/profile-smollm2-1t.json
mixed() { sed '/^workers:/,$!d' examples/clusters/mixed-replicas.yaml > "$TMP/mixed-$2.yaml"
          printf 'profiles:\n  fast: %s\n  slow: %s\n' "$1" "$1" >> "$TMP/mixed-$2.yaml"; }
mixed "$Z3" z3; mixed "$Z5" z5
replay() { # kind measured.json
  local c n; c=$(python3 -c "import json;print(json.load(open('$2'))['concurrency'])")
  n=$(python3 -c "import json;print(json.load(open('$2'))['requests'])")
  echo "== $2 (C=$c, $n) $1 profile"
  $T simulate --cluster "$TMP/mixed-$1.yaml" --roles as-written --concurrency "$c" --requests "$n" --max-tokens 50 \
      --host-cores 2 --k 0 --measured "$2" 2>&1 | grep -E "moves|^  (throughput_tok_s|latency_ms_p50)" | head -4
}
for m in docs/cluster/wave-stall-zen3/c8-off-*/measured.json docs/cluster/sim-zen3-chunks/*/measured.json \
         docs/cluster/bench-mixed-c8-zen3/measured.json docs/cluster/bench-mixed-c4-zen3/measured.json; do replay z3 "$m"; done
for m in docs/cluster/bench-mixed-c8-zen5/measured.json docs/cluster/bench-mixed-c4-zen5/measured.json \
         docs/cluster/sim-zen5/measured.json; do replay z5 "$m"; done
for r in 1 2 3 4; do
  d=docs/cluster/multiturn-sim-zen3/run$r
  cp $d/cluster.yaml "$TMP/mt.yaml"; printf 'profiles:\n  verify: %s\n' "$Z3" >> "$TMP/mt.yaml"
  echo "== $d chat"
  $T simulate --cluster "$TMP/mt.yaml" --roles as-written --host-cores 2 --conversations $d/chat.json 2>&1 \
      | grep -E "moves|TTFT|placements|^  (throughput_tok_s|latency_ms_p50|ttft)" | head -8
done
rm -rf "$TMP"
