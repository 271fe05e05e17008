#!/usr/bin/env bash
# Instructions and allocations per request of HttpRetryLayer on a successful
# small response, beside the stack of separate layers it replaces and the
# bare client, counted by callgrind (repeatable to the instruction); then
# the same end to end over loopback (benches/e2e_http.rs), the client's side
# beside bare reqwest, reqwest-retry and hyper-util.
#
#   bash benches/callgrind_http.sh            # markdown tables on stdout
set -euo pipefail
cd "$(dirname "$0")/.."

. benches/callgrind_common.sh

LOW=${LOW:-200}
HIGH=${HIGH:-2200}
bin=$(bench_binary http_layer --features http)

"$bin" --table >"$callgrind_tmp/table"
echo "| column | instructions/request | allocations/request |"
echo "|---|---:|---:|"
while IFS=$'\t' read -r column allocs; do
    low=$(collected "$bin" "$column" "$LOW")
    high=$(collected "$bin" "$column" "$HIGH")
    echo "| $column | $(( (high - low) / (HIGH - LOW) )) | $allocs |"
done < <(tail -n +2 "$callgrind_tmp/table")
echo
echo "($(rustc --version), $(nproc) cores, $(uname -m); requests $LOW vs $HIGH)"

# End to end (issue 54): the client's side of real requests over loopback,
# each stack answered by the same hyper server in a process of its own, so
# only the client is counted. 8 requests in flight.
E2E_LOW=${E2E_LOW:-500}
E2E_HIGH=${E2E_HIGH:-2500}
e2e=$(bench_binary e2e_http --features reqwest-middleware)
mkfifo "$callgrind_tmp/server_stdin"
# The server exits when its stdin closes: when this script's holder of the
# FIFO (the sleep below, killed on exit) goes.
sleep 100000 >"$callgrind_tmp/server_stdin" &
holder=$!
trap 'kill $holder 2>/dev/null; rm -rf "$callgrind_tmp"' EXIT
"$e2e" --serve <"$callgrind_tmp/server_stdin" >"$callgrind_tmp/addr" &
while [ ! -s "$callgrind_tmp/addr" ]; do sleep 0.1; done
addr=$(head -n1 "$callgrind_tmp/addr")
echo
echo "| stack, end to end over loopback | instructions/request | allocations/request |"
echo "|---|---:|---:|"
for stack in "reqwest" "reqwest + HttpRetryLayer::new()" \
    "reqwest + HttpRetryLayer, read-ahead to 1 MiB" "reqwest + reqwest-retry" \
    "hyper-util" "hyper-util + HttpRetryLayer::new()" \
    "hyper-util + HttpRetryLayer, read-ahead to 1 MiB"; do
    low=$(collected "$e2e" --client "$addr" --stack "$stack" --requests "$E2E_LOW")
    high=$(collected "$e2e" --client "$addr" --stack "$stack" --requests "$E2E_HIGH")
    allocs=$("$e2e" --client "$addr" --stack "$stack" --requests "$E2E_HIGH" 2>&1 |
        sed -n 's/^allocations\/request: //p')
    echo "| $stack | $(( (high - low) / (E2E_HIGH - E2E_LOW) )) | $allocs |"
done
echo
echo "(client side only; requests $E2E_LOW vs $E2E_HIGH, 8 in flight)"
