#!/usr/bin/env bash
# HttpRetryLayer end to end over loopback (issue 54): requests/s, p50 and
# p99 beside bare reqwest, reqwest-retry and hyper-util, then time to first
# byte and heap held per request for bodies of 16 KiB to 1 MiB. Timed, so
# run it on a quiet machine, and more than once; benches/callgrind_http.sh
# counts the same requests' instructions, which noise does not move.
#
#   bash benches/e2e_http.sh                  # markdown tables on stdout
#   ROUNDS=9 REQUESTS=20000 bash benches/e2e_http.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-9}
REQUESTS=${REQUESTS:-20000}
LARGE=${LARGE:-50}
bin=$(cargo bench --bench e2e_http --features reqwest-middleware --no-run \
    --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "e2e_http":
        print(m["executable"])')
"$bin" --rounds "$ROUNDS" --requests "$REQUESTS"
echo
"$bin" --large --requests "$LARGE"
