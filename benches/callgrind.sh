#!/usr/bin/env bash
# Instructions per request for every column of the hot-path comparison, counted
# by callgrind: repeatable to the instruction on a noisy machine. Each column
# runs twice (LOW and HIGH requests); the difference divided by HIGH - LOW
# removes start-up and set-up. Then prints allocations per request and the
# response future's size, measured in-process.
#
#   bash benches/callgrind.sh            # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

. benches/callgrind_common.sh

LOW=${LOW:-200}
HIGH=${HIGH:-2200}
bin=$(bench_binary instructions)

instructions() { # scenario column requests
    collected "$bin" "$1" "$2" "$3"
}

"$bin" --table >"$callgrind_tmp/table"
echo "| scenario | column | instructions/request | allocations/request | future bytes |"
echo "|---|---|---:|---:|---:|"
tail -n +2 "$callgrind_tmp/table" | while IFS=$'\t' read -r scenario column allocs bytes; do
    low=$(instructions "$scenario" "$column" "$LOW")
    high=$(instructions "$scenario" "$column" "$HIGH")
    per=$(( (high - low) / (HIGH - LOW) ))
    echo "| $scenario | $column | $per | $allocs | $bytes |"
done
echo
echo "($(rustc --version), $(nproc) cores, $(uname -m); requests $LOW vs $HIGH)"
