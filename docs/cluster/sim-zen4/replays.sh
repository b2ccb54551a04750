#!/bin/bash
# The simulator's replays of the Zen 4 mixed-replica runs (bench-mixed-c8-zen4, -c8-zen4-2, -c4-zen4)
# on this folder's profile (`tandem profile --cluster examples/clusters/mixed-replicas.yaml --force`,
# the same VM); prints the moves and the errors against each run. Run from the repository root;
# replay only (seconds).
set -euo pipefail
T=.venv/bin/tandem
TMP=$(mktemp -d)
Z4=$PWD/docs/cluster/sim-zen4/profile-smollm2-1t.json
sed '/^workers:/,$!d' examples/clusters/mixed-replicas.yaml > "$TMP/mixed.yaml"
printf 'profiles:\n  fast: %s\n  slow: %s\n' "$Z4" "$Z4" >> "$TMP/mixed.yaml"
for m in docs/cluster/bench-mixed-c8-zen4/measured.json docs/cluster/bench-mixed-c8-zen4-2/measured.json \
         docs/cluster/bench-mixed-c4-zen4/measured.json; do
  c=$(python3 -c "import json;print(json.load(open('$m'))['concurrency'])")
  n=$(python3 -c "import json;print(json.load(open('$m'))['requests'])")
  echo "== $m (C=$c, $n requests)"
  $T simulate --cluster "$TMP/mixed.yaml" --roles as-written --concurrency "$c" --requests "$n" --max-tokens 50 \
      --host-cores 2 --k 0 --measured "$m" 2>&1 | grep -E "moves|^  (throughput_tok_s|latency_ms_p50)|device speed" | head -6
done
