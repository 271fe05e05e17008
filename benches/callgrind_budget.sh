#!/usr/bin/env bash
# Instructions per deposit + withdraw pair for each budget, counted by
# callgrind: repeatable to the instruction on a noisy machine. Each budget runs
# LOW and HIGH pairs; the difference divided by HIGH - LOW removes start-up and
# building the budget. A pair is what benches/budget.rs times: a first attempt
# (a success for TpsBudget and RatioBudget-successes) and a retry; for the token
# bucket, a retry and the success that refunds it.
#
# Fails (exit 1) when a RatioBudget pair costs more instructions than a
# TpsBudget pair: the goal of issue 16.
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

declare -A per_pair
echo "| budget | instructions/pair |"
echo "|---|---:|"
while read -r budget; do
    low=$(instructions "$budget" "$LOW")
    high=$(instructions "$budget" "$HIGH")
    per_pair[$budget]=$(( (high - low) / (HIGH - LOW) ))
    echo "| $budget | ${per_pair[$budget]} |"
done < <("$bin" --list)
echo
echo "($(rustc --version), $(uname -m); pairs $LOW vs $HIGH)"

for budget in RatioBudget RatioBudget-successes; do
    if (( per_pair[$budget] > per_pair[TpsBudget] )); then
        echo "$budget: ${per_pair[$budget]} instructions per pair, more than TpsBudget's ${per_pair[TpsBudget]}" >&2
        exit 1
    fi
done
