#!/usr/bin/env bash
# Our jitter generator beside rand's SmallRng (issue 27): instructions per
# operation, counted by callgrind (repeatable to the instruction on a noisy
# machine), each operation run LOW and HIGH times, the difference divided by
# HIGH - LOW to remove start-up and set-up. The ns columns are criterion's from
# the last `cargo bench --bench jitter_rng`, when there is one. Then the
# generators' sizes, and what rand would add to a request that fails twice,
# against that request's whole cost through the layer (benches/callgrind.sh's
# `retry_path ours`, counted here too).
#
#   bash benches/callgrind_jitter.sh     # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

. benches/callgrind_common.sh

LOW=${LOW:-1000}
HIGH=${HIGH:-11000}
REQUESTS_LOW=${REQUESTS_LOW:-200}
REQUESTS_HIGH=${REQUESTS_HIGH:-2200}
bin=$(bench_binary jitter_rng)
criterion_dir=${CARGO_TARGET_DIR:-target}/criterion

per_op() { # operation side
    local low high
    low=$(collected "$bin" --count "$1" "$2" "$LOW")
    high=$(collected "$bin" --count "$1" "$2" "$HIGH")
    echo $(( (high - low) / (HIGH - LOW) ))
}

# criterion's estimate, in ns, for one operation and side, or "–".
nanos() { # operation side
    local file="$criterion_dir/jitter_rng_$1/$2/new/estimates.json"
    if [[ -f $file ]]; then
        python3 -c 'import json, sys
e = json.load(open(sys.argv[1]))
estimate = e.get("slope") or e["mean"]
print("%.1f" % estimate["point_estimate"])' "$file"
    else
        echo "–"
    fi
}

ratio() { # rand ours
    python3 -c 'import sys; print(f"{int(sys.argv[1]) / int(sys.argv[2]):.2f}")' "$1" "$2"
}

echo "| operation | ours: instructions | rand: instructions | rand / ours | ours: ns | rand: ns |"
echo "|---|---:|---:|---:|---:|---:|"
declare -A count
while IFS=$'\t' read -r op what; do
    ours=$(per_op "$op" ours)
    rand=$(per_op "$op" rand)
    count[$op/ours]=$ours
    count[$op/rand]=$rand
    echo "| $what | $ours | $rand | $(ratio "$rand" "$ours") | $(nanos "$op" ours) | $(nanos "$op" rand) |"
done < <("$bin" --list)
while IFS=$'\t' read -r what ours rand; do
    echo "| bytes: $what | $ours | $rand | $(ratio "$rand" "$ours") | | |"
done < <("$bin" --sizes)

requests=$(bench_binary instructions)
low=$(collected "$requests" retry_path ours "$REQUESTS_LOW")
high=$(collected "$requests" retry_path ours "$REQUESTS_HIGH")
retry_path=$(( (high - low) / (REQUESTS_HIGH - REQUESTS_LOW) ))
added=$(( count[request/rand] - count[request/ours] ))
echo
echo "A request that fails twice costs $retry_path instructions through the layer"
echo "(\`retry_path ours\` of benches/callgrind.sh); rand's stream and two draws would"
echo "change that by $added instructions, $(python3 -c "import sys; print(f'{100 * int(sys.argv[1]) / int(sys.argv[2]):+.1f}')" "$added" "$retry_path") % (an estimate: the generator swapped outside the layer)."
echo
echo "($(rustc --version), $(uname -m); operations $LOW vs $HIGH, requests $REQUESTS_LOW vs $REQUESTS_HIGH)"
