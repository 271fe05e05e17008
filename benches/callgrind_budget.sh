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

. benches/callgrind_common.sh

LOW=${LOW:-1000}
HIGH=${HIGH:-11000}
bin=$(bench_binary budget_instructions)

instructions() { # budget pairs
    collected "$bin" "$1" "$2"
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
