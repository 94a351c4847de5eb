#!/usr/bin/env bash
# A throwaway pyvisor cluster on this machine: a PostgreSQL (initdb in a temp dir, Unix socket
# only; it refuses to run as root, so as root it runs as the system user `pyvisor-pg`), three
# pyvisor nodes with HTTP on 127.0.0.1:8801-8803 sharing it, and HAProxy on 127.0.0.1:8800 in
# front (examples/cluster/haproxy.cfg). It prints where to point a client, then waits;
# Ctrl-C stops everything it started and removes the temp dir.
#
#   examples/cluster/run.sh                  # builds target/release/pyvisor first
#   PYVISOR=path/to/pyvisor examples/cluster/run.sh
#   PYVISOR_CLUSTER_PORT=9900 examples/cluster/run.sh   # HAProxy on 9900, nodes 9901-9903
#
# PostgreSQL and HAProxy come from Debian's packages (scripts/cluster-packages.sh installs
# them as root).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bash "$root/scripts/cluster-packages.sh"

pyvisor=${PYVISOR:-}
if [ -z "$pyvisor" ]; then
    (cd "$root" && cargo build --release --quiet -p pyvisor)
    pyvisor="$root/target/release/pyvisor"
fi
base=${PYVISOR_CLUSTER_PORT:-8800}
nodes=3

work=$(mktemp -d -t pyvisor-cluster-XXXXXX)
chmod 755 "$work"
pids=()
stop() {
    trap - EXIT INT TERM
    # HAProxy and the nodes first (SIGTERM: a node stops gracefully), PostgreSQL last
    # (SIGINT: its fast shutdown).
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        if [ "$i" = 0 ]; then kill -INT "${pids[$i]}" 2>/dev/null || true
        else kill -TERM "${pids[$i]}" 2>/dev/null || true; fi
        wait "${pids[$i]}" 2>/dev/null || true
    done
    rm -rf "$work"
    echo "pyvisor cluster: stopped"
}
trap stop EXIT
trap 'exit 130' INT TERM

# Polls `$@` every 0.1 s for up to 60 s; fails naming `what`.
wait_for() {
    local what=$1
    shift
    for _ in $(seq 600); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "pyvisor cluster: $what did not come up; logs in $work" >&2
    trap - EXIT
    return 1
}

# PostgreSQL, as its own user when this runs as root.
pg_bin=$(pg_config --bindir 2>/dev/null || true)
if [ ! -x "$pg_bin/initdb" ]; then
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
as_pg=()
mkdir -p "$work/pg"
if [ "$(id -u)" = 0 ]; then
    chown pyvisor-pg: "$work/pg"
    as_pg=(setpriv --reuid=pyvisor-pg --regid=pyvisor-pg --init-groups --)
fi
"${as_pg[@]}" "$pg_bin/initdb" --no-sync --auth=trust --encoding=UTF8 --username=pyvisor \
    -D "$work/pg/data" >"$work/pg/initdb.log"
"${as_pg[@]}" "$pg_bin/postgres" -D "$work/pg/data" -k "$work/pg" -c listen_addresses= \
    -c fsync=off -c synchronous_commit=off >"$work/pg/server.log" 2>&1 &
pids+=($!)
wait_for PostgreSQL "$pg_bin/pg_isready" -q -h "$work/pg" -U pyvisor
"$pg_bin/createdb" -h "$work/pg" -U pyvisor pyvisor

# The nodes: each its own state, socket and runtime dirs; all share the store.
for n in $(seq "$nodes"); do
    home="$work/node-$n"
    port=$((base + n))
    mkdir -p "$home/run" "$home/state" "$home/cache" "$home/sandbox"
    # As root each worker runs under a uid of its own: the nodes share this machine, so each
    # takes its own range, and no two nodes' sessions ever share a uid.
    uid_range=""
    if [ "$(id -u)" = 0 ]; then uid_range="uid_range = \"$((60 + n))000-$((60 + n))999\""; fi
    cat >"$home/pyvisor.toml" <<TOML
[server]
socket = "$home/run/pyvisor.sock"
http = "127.0.0.1:$port"

[state]
dir = "$home/state"

[pool]
min_idle = 2

[sandbox]
dir = "$home/sandbox"
$uid_range

[cluster]
store = "host=$work/pg user=pyvisor dbname=pyvisor"
node_id = "node-$n"
advertise_url = "http://127.0.0.1:$port"
TOML
    XDG_RUNTIME_DIR="$home/run" XDG_STATE_HOME="$home/state" XDG_CACHE_HOME="$home/cache" \
        "$pyvisor" serve --config "$home/pyvisor.toml" >"$home/daemon.log" 2>&1 &
    pids+=($!)
done
for n in $(seq "$nodes"); do
    wait_for "node-$n" curl -fsS "http://127.0.0.1:$((base + n))/readyz"
done

# HAProxy, with the example's ports moved to this run's.
sed -e "s/127\.0\.0\.1:8800/127.0.0.1:$base/" \
    -e "s/127\.0\.0\.1:8801/127.0.0.1:$((base + 1))/" \
    -e "s/127\.0\.0\.1:8802/127.0.0.1:$((base + 2))/" \
    -e "s/127\.0\.0\.1:8803/127.0.0.1:$((base + 3))/" \
    "$here/haproxy.cfg" >"$work/haproxy.cfg"
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
wait_for HAProxy curl -fsS "http://127.0.0.1:$base/readyz"

for n in $(seq "$nodes"); do
    echo "pyvisor cluster: node-$n pid ${pids[$n]} http://127.0.0.1:$((base + n)) (log $work/node-$n/daemon.log)"
done
echo "pyvisor cluster: ready at http://127.0.0.1:$base (HAProxy); store host=$work/pg user=pyvisor dbname=pyvisor; Ctrl-C stops it"
wait
