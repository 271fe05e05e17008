#!/usr/bin/env bash
# Instructions per request for every column of the hot-path comparison, counted
# by callgrind: repeatable to the instruction on a noisy machine. Each column
# runs twice (LOW and HIGH requests); the difference divided by HIGH - LOW
# removes start-up and set-up. Then prints allocations per request and the
# response future's size, measured in-process.
#
# Fails (exit 1) when one of our columns misses issue 42's goals (the happy
# path more than 50 instructions over a bare tower::retry, the retry path over
# 5,300) or its future is larger than tower::retry's, when the default budget
# adds more than DEFAULT_BUDGET_MAX instructions to the happy path (issue
# 16's goal), or a closed breaker more than OPTION_MAX (issue 29's) or
# hedging more than HEDGING_MAX. Each #[inline]/#[cold] left in the core is
# one whose removal made this script fail (docs/RESULTS.md, issue 42).
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
# Issue 42's goals: the happy path within 50 instructions of a bare
# tower::retry, the retry path (two failures, zero delay) within 5,300, and
# no future larger than tower::retry's.
HAPPY_OVER_TOWER_MAX=${HAPPY_OVER_TOWER_MAX:-50}
RETRY_PATH_MAX=${RETRY_PATH_MAX:-5300}
for scenario in happy_path retry_path; do
    tower=$scenario/tower::retry
    for column in "ours" "ours + jitter + bucket + stats"; do
        ours=$scenario/$column
        if [[ $scenario == happy_path ]]; then
            limit=$(( per_request[$tower] + HAPPY_OVER_TOWER_MAX ))
        else
            limit=$RETRY_PATH_MAX
        fi
        if (( per_request[$ours] > limit )); then
            echo "$ours: ${per_request[$ours]} instructions, more than $limit" >&2
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
# Issue 50: the default bucket counts every first-try success (one atomic
# increment; one in 16 reads the clock) so its capacity follows traffic: 16
# instructions before, 26 with it.
DEFAULT_BUDGET_MAX=${DEFAULT_BUDGET_MAX:-30}
with_budget=${per_request["happy_path/ours, default budget"]}
without_budget=${per_request["happy_path/ours, .no_budget()"]}
budget_cost=$(( with_budget - without_budget ))
if (( budget_cost > DEFAULT_BUDGET_MAX )); then
    echo "the default budget adds $budget_cost instructions to the happy path, more than $DEFAULT_BUDGET_MAX" >&2
    status=1
fi
# Issue 29: a closed breaker costs at most this much over the defaults on a
# call answered at once. Hedging tracks each request from its call since
# issue 42 (its first-poll type state went): HEDGING_MAX bounds that.
OPTION_MAX=${OPTION_MAX:-30}
HEDGING_MAX=${HEDGING_MAX:-900}
cost=$(( per_request["happy_path/ours, closed breaker"] - with_budget ))
if (( cost > OPTION_MAX )); then
    echo "a closed breaker adds $cost instructions to the happy path, more than $OPTION_MAX" >&2
    status=1
fi
cost=$(( per_request["happy_path/ours, hedging configured"] - with_budget ))
if (( cost > HEDGING_MAX )); then
    echo "hedging configured adds $cost instructions to the happy path, more than $HEDGING_MAX" >&2
    status=1
fi
exit $status
