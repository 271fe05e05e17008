#!/usr/bin/env bash
# Instructions per request for every column of the hot-path comparison, counted
# by callgrind: repeatable to the instruction on a noisy machine. Each column
# runs twice (LOW and HIGH requests); the difference divided by HIGH - LOW
# removes start-up and set-up. Then prints allocations per request and the
# response future's size, measured in-process.
#
# Fails (exit 1) when, on either path, one of our columns costs more
# instructions than a bare tower::retry or its future is larger, or when the
# default budget adds more than DEFAULT_BUDGET_MAX instructions to the happy
# path (issue 16's goals), or a closed breaker or hedging with no hedge
# needed more than OPTION_MAX (issue 29's).
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
declare -A per_request size
while IFS=$'\t' read -r scenario column allocs bytes; do
    low=$(instructions "$scenario" "$column" "$LOW")
    high=$(instructions "$scenario" "$column" "$HIGH")
    per=$(( (high - low) / (HIGH - LOW) ))
    per_request[$scenario/$column]=$per
    size[$scenario/$column]=$bytes
    echo "| $scenario | $column | $per | $allocs | $bytes |"
done < <(tail -n +2 "$callgrind_tmp/table")
echo
echo "($(rustc --version), $(nproc) cores, $(uname -m); requests $LOW vs $HIGH)"

status=0
for scenario in happy_path retry_path; do
    tower=$scenario/tower::retry
    for column in "ours" "ours + jitter + bucket + stats"; do
        ours=$scenario/$column
        if (( per_request[$ours] >= per_request[$tower] )); then
            echo "$ours: ${per_request[$ours]} instructions, not fewer than tower::retry's ${per_request[$tower]}" >&2
            status=1
        fi
        if (( size[$ours] > size[$tower] )); then
            echo "$ours: a ${size[$ours]}-byte future, larger than tower::retry's ${size[$tower]}" >&2
            status=1
        fi
    done
done
# Issue 16 asks about 10 (11 with rustc 1.95); the slack is for toolchains,
# which move a few instructions either way.
DEFAULT_BUDGET_MAX=${DEFAULT_BUDGET_MAX:-15}
with_budget=${per_request["happy_path/ours, default budget"]}
without_budget=${per_request["happy_path/ours, .no_budget()"]}
budget_cost=$(( with_budget - without_budget ))
if (( budget_cost > DEFAULT_BUDGET_MAX )); then
    echo "the default budget adds $budget_cost instructions to the happy path, more than $DEFAULT_BUDGET_MAX" >&2
    status=1
fi
# Issue 29: a closed breaker, and hedging that needs no hedge, each cost at
# most this much over the defaults on a call answered at once.
OPTION_MAX=${OPTION_MAX:-30}
for column in "ours, closed breaker" "ours, hedging configured"; do
    cost=$(( per_request["happy_path/$column"] - with_budget ))
    if (( cost > OPTION_MAX )); then
        echo "$column adds $cost instructions to the happy path, more than $OPTION_MAX" >&2
        status=1
    fi
done
exit $status
