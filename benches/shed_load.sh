#!/usr/bin/env bash
# The server half under a real load generator (issue 52): a hyper server
# (benches/shed_load.rs) whose capacity is 200 requests a second, on two
# server models (queue: 20 workers, 100 ms each, requests beyond wait;
# thrash: the same, each worker slower by 1.5 % per request held past 20),
# behind no protection, tower's load_shed over concurrency_limit(20) (the
# knee, known) and ShedLayer with its defaults; driven by oha, open loop at
# a constant rate (--latency-correction; connections enough for every
# request to wait its 2 s timeout) at 0.5x, 1x, 2x and 4x the capacity, one
# server per model and protection, the loads in that order.
#
# goodput: 200s oha received within its 2 s timeout, per second, as % of
# the capacity; p99: of the 200s, from the server's call to the end of the
# body (the admitted requests; without the client's connection set-up).
#
#   bash benches/shed_load.sh     # markdown table on stdout; SECS=10 a cell
#   MODELS=queue PROTECTIONS="none shed" LOADS="1 2" bash benches/shed_load.sh
#
# It installs oha from crates.io (cargo install oha --locked) into
# target/shed-load/oha the first time. Not part of CI: about 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-10}
LOADS=${LOADS:-"0.5 1 2 4"}
CAPACITY=200
cache=${SHED_LOAD_CACHE:-target/shed-load}
mkdir -p "$cache"
oha=$cache/oha/bin/oha
if ! [ -x "$oha" ]; then
    cargo install oha --locked --root "$cache/oha" >&2
fi
ulimit -n 65536 2>/dev/null || true

bin=$(cargo bench --bench shed_load --features shed --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == "shed_load":
        print(m["executable"])')

server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null || true' EXIT

echo "| server model | protection | $(for l in $LOADS; do printf '%sx | ' "$l"; done | sed 's/ | $//') |"
echo "|---|---|$(for _ in $LOADS; do printf -- '---|'; done)"
for model in ${MODELS:-queue thrash}; do
    for protection in ${PROTECTIONS:-none tower shed}; do
        rm -f "$cache/ports"
        "$bin" "$model" "$protection" >"$cache/ports" &
        server=$!
        for _ in $(seq 50); do
            [ -s "$cache/ports" ] && break
            sleep 0.1
        done
        read -r _ port _ stats <"$cache/ports"
        row="| $model | $protection |"
        for load in $LOADS; do
            rate=$(python3 -c "print(int($load * $CAPACITY))")
            connections=$(python3 -c "print(max(50, int($rate * 2.5)))")
            curl -s "http://127.0.0.1:$stats/" >/dev/null
            "$oha" -z "${SECS}s" -q "$rate" -c "$connections" -t 2s --latency-correction \
                --no-tui --output-format json "http://127.0.0.1:$port/" >"$cache/oha.json" 2>"$cache/oha.log" ||
                echo "oha failed: $(tail -1 "$cache/oha.log")" >&2
            server_side=$(curl -s "http://127.0.0.1:$stats/")
            row+=" $(CACHE=$cache SECS=$SECS CAPACITY=$CAPACITY SERVER="$server_side" python3 -c 'import json, os
oha = json.load(open(os.environ["CACHE"] + "/oha.json"))
server = json.loads(os.environ["SERVER"])
ok = int(oha.get("statusCodeDistribution", {}).get("200", 0))
goodput = 100.0 * ok / float(os.environ["SECS"]) / float(os.environ["CAPACITY"])
p99 = server["p99_ms"]
print(f"{goodput:.1f} %, {p99:.0f} ms |", end="")')"
            sleep 2
        done
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=
        echo "$row"
    done
done
