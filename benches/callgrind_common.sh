# Shared by the callgrind scripts (callgrind.sh, callgrind_budget.sh,
# poller_callgrind.sh); sourced, not run. Each script runs its bench binary
# twice, for LOW and HIGH units of work, and divides the difference by
# HIGH - LOW, which removes start-up and set-up.

if ! command -v valgrind >/dev/null; then
    apt-get update -qq && apt-get install -y -qq valgrind >/dev/null
fi

callgrind_tmp=$(mktemp -d)
trap 'rm -rf "$callgrind_tmp"' EXIT

# The executable of bench target $1, built with the cargo arguments that follow.
bench_binary() {
    local name=$1
    shift
    cargo bench --bench "$name" --no-run --message-format=json "$@" 2>/dev/null |
        NAME="$name" python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("name") == os.environ["NAME"]:
        print(m["executable"])'
}

# Instructions callgrind counts for one run of the command given.
collected() {
    valgrind --tool=callgrind --callgrind-out-file="$callgrind_tmp/out" "$@" \
        2>"$callgrind_tmp/log" >/dev/null
    sed -n 's/^==[0-9]*== Collected : \([0-9]*\)/\1/p' "$callgrind_tmp/log"
}
