#!/usr/bin/env bash
# Instructions and allocations per request of HttpRetryLayer on a successful
# small response, beside the stack of separate layers it replaces and the
# bare client, counted by callgrind (repeatable to the instruction).
#
#   bash benches/callgrind_http.sh            # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

. benches/callgrind_common.sh

LOW=${LOW:-200}
HIGH=${HIGH:-2200}
bin=$(bench_binary http_layer --features http)

"$bin" --table >"$callgrind_tmp/table"
echo "| column | instructions/request | allocations/request |"
echo "|---|---:|---:|"
while IFS=$'\t' read -r column allocs; do
    low=$(collected "$bin" "$column" "$LOW")
    high=$(collected "$bin" "$column" "$HIGH")
    echo "| $column | $(( (high - low) / (HIGH - LOW) )) | $allocs |"
done < <(tail -n +2 "$callgrind_tmp/table")
echo
echo "($(rustc --version), $(nproc) cores, $(uname -m); requests $LOW vs $HIGH)"
