#!/usr/bin/env bash
# The shed layer's happy path (admitted, no queueing) in instructions per
# request, beside tower's load_shed over concurrency_limit and a bare service
# (issue 43): callgrind, each column run LOW and HIGH times, the difference
# divided by HIGH - LOW to remove start-up and set-up.
#
#   bash benches/callgrind_shed.sh       # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

. benches/callgrind_common.sh

LOW=${LOW:-200}
HIGH=${HIGH:-2200}
bin=$(bench_binary shed_instructions --features shed)

echo "| column | instructions/request |"
echo "|---|---:|"
for column in bare tower shed; do
    low=$(collected "$bin" "$column" "$LOW")
    high=$(collected "$bin" "$column" "$HIGH")
    echo "| $column | $(( (high - low) / (HIGH - LOW) )) |"
done
