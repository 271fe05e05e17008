#!/usr/bin/env bash
# Instructions per deposit + withdraw pair for each budget, counted by
# callgrind: repeatable to the instruction on a noisy machine. Each budget runs
# LOW and HIGH pairs; the difference divided by HIGH - LOW removes start-up and
# building the budget. A pair is what benches/budget.rs times: what the budget
# earns on (a success for TpsBudget and TokenBucket-successes, a first attempt
# for TokenBucket-requests) and a retry; for the AWS-style TokenBucket, a retry
# and the success that refunds it.
#
# Fails (exit 1) when a token bucket pair, earning on successes as TpsBudget
# does or on first attempts as Finagle does, costs more instructions than a
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

for budget in TokenBucket-successes TokenBucket-requests; do
    if (( per_pair[$budget] > per_pair[TpsBudget] )); then
        echo "$budget: ${per_pair[$budget]} instructions per pair, more than TpsBudget's ${per_pair[TpsBudget]}" >&2
        exit 1
    fi
done
