#!/usr/bin/env bash
# Instructions per poll of the poller over 1,000 providers, for every scenario
# of benches/poller.rs, counted by callgrind (repeatable on a noisy machine).
# Each scenario runs LOW and HIGH rounds after set-up; the difference divided
# by the polls between them removes start-up, set-up and shutdown.
#
#   bash benches/poller_callgrind.sh     # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

. benches/callgrind_common.sh

LOW=${LOW:-10}
HIGH=${HIGH:-30}
PROVIDERS=1000
bin=$(bench_binary poller --all-features)

instructions() { # scenario rounds
    collected "$bin" --run "$1" "$2"
}

echo "| scenario | instructions/poll |"
echo "|---|---:|"
for scenario in unread read held ranked spread; do
    low=$(instructions "$scenario" "$LOW")
    high=$(instructions "$scenario" "$HIGH")
    echo "| $scenario | $(( (high - low) / ((HIGH - LOW) * PROVIDERS) )) |"
done
echo
echo "($(rustc --version), $(uname -m); rounds $LOW vs $HIGH)"
