#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone: installs what the tests need (idempotently),
# then checks formatting and lints, then runs every test against real Python workers.
set -euo pipefail
cd "$(dirname "$0")/.."

# Optional Python packages the tests exercise (DataFrame HTML results, matplotlib figures).
if ! python3 -c 'import pandas, matplotlib' 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check pandas matplotlib
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --quiet 2>&1 | tee "$log"
# cargo ends with the (empty) doc-test run of the last crate; close with the whole count.
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
