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

if ! command -v valgrind >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi

LOW=${LOW:-200}
HIGH=${HIGH:-2200}
bin=$(cargo bench --bench instructions --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "instructions":
        print(m["executable"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

instructions() { # scenario column requests
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bin" "$1" "$2" "$3" 2>"$tmp/log" >/dev/null
    sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$tmp/log"
}

"$bin" --table >"$tmp/table"
echo "| scenario | column | instructions/request | allocations/request | future bytes |"
echo "|---|---|---:|---:|---:|"
tail -n +2 "$tmp/table" | while IFS=$'\t' read -r scenario column allocs bytes; do
    low=$(instructions "$scenario" "$column" "$LOW")
    high=$(instructions "$scenario" "$column" "$HIGH")
    per=$(( (high - low) / (HIGH - LOW) ))
    echo "| $scenario | $column | $per | $allocs | $bytes |"
done
echo
echo "($(rustc --version), $(nproc) cores, $(uname -m); requests $LOW vs $HIGH)"
