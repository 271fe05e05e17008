#!/usr/bin/env bash
# Instructions per poll of the poller over 1,000 providers, for every scenario
# of benches/poller.rs, counted by callgrind (repeatable on a noisy machine).
# Each scenario runs LOW and HIGH rounds after set-up; the difference divided
# by the polls between them removes start-up, set-up and shutdown.
#
#   bash benches/poller_callgrind.sh     # markdown table on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

LOW=${LOW:-10}
HIGH=${HIGH:-30}
PROVIDERS=1000
bin=$(cargo bench --all-features --bench poller --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "poller":
        print(m["executable"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

instructions() { # scenario rounds
    valgrind --tool=callgrind --callgrind-out-file="$tmp/out" "$bin" --run "$1" "$2" 2>"$tmp/log" >/dev/null
    sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$tmp/log"
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
