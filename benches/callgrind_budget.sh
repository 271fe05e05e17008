#!/usr/bin/env bash
# Instructions per deposit + withdraw pair for each budget, counted by
# callgrind: repeatable to the instruction on a noisy machine. Each budget runs
# LOW and HIGH pairs; the difference divided by HIGH - LOW removes start-up and
# building the budget. A pair is what benches/budget.rs times: a first attempt
# (a success for TpsBudget and RatioBudget-successes) and a retry; for the token
# bucket, a retry and the success that refunds it.
#
#   bash benches/callgrind_budget.sh     # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v valgrind >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi

LOW=${LOW:-1000}
HIGH=${HIGH:-11000}
bin=$(cargo bench --bench budget_instructions --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "budget_instructions":
        print(m["executable"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

instructions() { # budget pairs
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bin" "$1" "$2" 2>"$tmp/log" >/dev/null
    sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$tmp/log"
}

echo "| budget | instructions/pair |"
echo "|---|---:|"
"$bin" --list | while read -r budget; do
    low=$(instructions "$budget" "$LOW")
    high=$(instructions "$budget" "$HIGH")
    echo "| $budget | $(( (high - low) / (HIGH - LOW) )) |"
done
echo
echo "($(rustc --version), $(uname -m); pairs $LOW vs $HIGH)"
