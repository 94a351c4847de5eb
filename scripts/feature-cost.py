"""What memory and proactive computation cost an execution: `x = 1` round trips through the
Unix socket of a daemon started four times (defaults, memory off, proactive off, both off).

    python3 scripts/feature-cost.py target/release/pyvisor [ROUND_TRIPS]

Uses the Python client of clients/python (no install needed); prints p50 and p99 per setting.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python", "src"))
from pyvisor_client import Client  # noqa: E402

SETTINGS = [
    ("defaults", ""),
    ("memory off", "[memory]\nenabled = false\n"),
    ("proactive off", "[proactive]\nenabled = false\n"),
    ("both off", "[memory]\nenabled = false\n[proactive]\nenabled = false\n"),
]


def round_trips(binary, extra, n):
    with tempfile.TemporaryDirectory() as d:
        socket = os.path.join(d, "s.sock")
        config = os.path.join(d, "pyvisor.toml")
        with open(config, "w") as f:
            f.write(f'[server]\nsocket = "{socket}"\n[state]\ndir = "{d}/state"\n{extra}')
        with open(os.path.join(d, "log"), "w") as log:
            daemon = subprocess.Popen([binary, "serve", "--config", config],
                                      stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(socket):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the daemon did not start; see {d}/log")
                time.sleep(0.05)
            session = Client(socket).create_session()
            for _ in range(n // 10):
                session.run("x = 1")
            samples = []
            for _ in range(n):
                started = time.perf_counter()
                session.run("x = 1")
                samples.append((time.perf_counter() - started) * 1e6)
        finally:
            daemon.terminate()
            daemon.wait()
    samples.sort()
    return samples[len(samples) // 2], samples[int(len(samples) * 0.99)]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    for name, extra in SETTINGS:
        p50, p99 = round_trips(binary, extra, n)
        print(f"{name:<14} p50 {p50:7.0f} µs   p99 {p99:7.0f} µs", flush=True)


if __name__ == "__main__":
    main()
