#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone: creates the project's own virtual environment
# (idempotently) with the Python packages the tests use, checks formatting and lints, runs
# every Rust test against real Python workers, then the Python and TypeScript clients' tests
# against a real daemon. The test sessions' interpreter is the venv's: it comes first on PATH
# as `python3`.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, on stderr, so a slow CI run says where its minutes went.
phase_started=$SECONDS
phase_done() {
    echo "test.sh: $1 took $((SECONDS - phase_started)) s" >&2
    phase_started=$SECONDS
}

# A venv the project owns, never the system Python (PEP 668 marks Debian's and Ubuntu's as
# externally managed). pandas and matplotlib: DataFrame HTML results and figures; pytest:
# the client's tests.
venv=.venv
if [ ! -x "$venv/bin/python3" ]; then
    if ! python3 -m venv "$venv" 2>/dev/null; then
        rm -rf "$venv"
        # Debian and Ubuntu ship the venv module apart; as root, install it.
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            minor=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv "python$minor-venv"
        fi
        if ! python3 -m venv "$venv"; then
            rm -rf "$venv"
            echo "scripts/test.sh: python3 -m venv failed; on Debian or Ubuntu install python3-venv" >&2
            exit 1
        fi
    fi
fi
if ! "$venv/bin/python3" -c 'import pandas, matplotlib, pytest' 2>/dev/null; then
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check pandas matplotlib pytest
fi
# rlms: the recursive-language-model library whose environment pyvisor_client.rlm provides.
if ! "$venv/bin/python3" -c 'import importlib.metadata as m; assert m.version("rlms") == "0.1.3"' \
        2>/dev/null; then
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check rlms==0.1.3
fi
"$venv/bin/python3" -m pip install --quiet --disable-pip-version-check ./clients/python
PATH="$PWD/$venv/bin:$PATH"
export PATH
phase_done "the Python environment"

# The cluster tests (engine/tests/suite/cluster*.rs) start their own throwaway PostgreSQL
# and HAProxy from Debian's packages; as root this installs them and the user PostgreSQL
# runs as (it refuses root). Otherwise the caller needs them installed.
bash scripts/cluster-packages.sh
phase_done "the Debian packages"

# A fresh clone (CI) builds everything once: incremental compilation's caches would cost it
# time and gigabytes of disk and save nothing. A developer's tree, which has a target dir,
# keeps them.
if [ ! -d target ]; then
    export CARGO_INCREMENTAL=0
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The embedding API alone: no server, client or CLI (no actix-web, clap, rustyline).
cargo clippy -p pyvisor --no-default-features --quiet -- -D warnings
# An embedder that only talks to a daemon: the socket client without the server.
cargo clippy -p pyvisor --no-default-features --features client --quiet -- -D warnings
phase_done "fmt and clippy"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --quiet 2>&1 | tee "$log"
phase_done "cargo test (build and run)"
# The client's tests start the `pyvisor` binary that `cargo test` built.
python3 -m pytest -q -p no:cacheprovider clients/python/tests 2>&1 | tee -a "$log"
phase_done "the Python client's tests"
# The TypeScript client (Node 20): its locked dev dependencies, the type check and build, then
# its node --test suites (with examples/rlm-node) against that same binary.
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error \
    && npx tsc -p . && npx tsc -p ../../examples/rlm-node && node --test test/*.test.js) 2>&1 | tee -a "$log"
phase_done "the TypeScript client's build and tests"
# cargo ends with the (empty) doc-test run of the last crate; close with the whole count.
# pytest closes with "N failed, N passed in Ts" (each part only when not zero); node --test
# with "# pass N" and "# fail N".
awk '/^test result:/ { passed += $4; failed += $6 }
     /^# pass [0-9]+$/ { passed += $3 }
     /^# fail [0-9]+$/ { failed += $3 }
     / in [0-9.]+s/ && !/^test result:/ {
         for (i = 2; i <= NF; i++) {
             word = $(i); gsub(/[,=]/, "", word)
             if (word == "passed") passed += $(i - 1)
             if (word == "failed" || word == "error" || word == "errors") failed += $(i - 1)
         }
     }
     END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
