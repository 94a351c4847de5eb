#!/usr/bin/env bash
# Installs what a cluster of pyvisor nodes on this machine needs, idempotently: PostgreSQL's
# server and HAProxy from Debian's packages, and the system user PostgreSQL runs as
# (`pyvisor-pg`: it refuses to run as root). Run by scripts/test.sh and
# examples/cluster/run.sh. As another user than root it installs nothing and says what is
# missing.
set -euo pipefail

missing=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null \
    || missing+=(postgresql)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)

if [ "$(id -u)" != 0 ]; then
    if [ ${#missing[@]} -gt 0 ]; then
        echo "scripts/cluster-packages.sh: missing ${missing[*]}; install them (as root: this script)" >&2
        exit 1
    fi
    exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "scripts/cluster-packages.sh: missing ${missing[*]} and no apt-get to install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    # Debian starts the packaged services; the project runs its own, in temp dirs.
    for service in postgresql haproxy; do
        if command -v systemctl >/dev/null && systemctl is-active --quiet "$service" 2>/dev/null; then
            systemctl stop "$service" || true
        fi
    done
fi
if ! id pyvisor-pg >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pyvisor-pg
fi
