"""The rlms library's own tests of its subprocess-kernel environment, run as they are and
against PyvisorREPL, in one run: how many pass and how long each set takes.

The tests are the ``tests/test_ipython_repl.py`` of the library's source distribution
(rlms 0.1.3, fetched from PyPI into a temp dir at each run; nothing of it is kept in this
repository). They construct ``IPythonREPL(kernel_mode=...)``; for the second run a pytest
plugin replaces that class with a subclass of PyvisorREPL that takes (and ignores) the
``kernel_mode`` argument, whose REPLs are sessions of a daemon this script starts. Only the
``subprocess`` cases run (``-k subprocess``): the in-process kernel mode is no isolation at all,
which is not what PyvisorREPL replaces.

    python3 clients/python/bench/rlm_reference_tests.py

Needs pip access to PyPI, and ipykernel and jupyter_client for the reference's kernels
(installed into this interpreter's environment when missing, as rlm_envs.py does).
"""

import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rlm_envs  # noqa: E402  (installs the kernel packages; starts the daemon)

VERSION = "0.1.3"

SHIM = textwrap.dedent('''
    """Makes the rlms tests' IPythonREPL a PyvisorREPL on the daemon at $PYVISOR_SOCKET."""
    import rlm.environments.ipython_repl as reference
    from pyvisor_client.rlm import PyvisorREPL

    class PyvisorAsIPython(PyvisorREPL):
        def __init__(self, *args, kernel_mode=None, **kwargs):
            super().__init__(*args, **kwargs)

    reference.IPythonREPL = PyvisorAsIPython
''')


def fetch_tests(into):
    """The library's test file, from its source distribution."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", "--disable-pip-version-check",
                    "rlms==%s" % VERSION, "-d", str(into)], check=True)
    with tarfile.open(into / ("rlms-%s.tar.gz" % VERSION)) as sdist:
        member = sdist.getmember("rlms-%s/tests/test_ipython_repl.py" % VERSION)
        member.name = "test_ipython_repl.py"
        sdist.extract(member, into, filter="data")
    return into / "test_ipython_repl.py"


def run_tests(name, tests, env, plugin_args):
    started = time.monotonic()
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-k", "subprocess", *plugin_args, str(tests)],
                         cwd=tests.parent, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    summary = (ran.stdout.strip().splitlines() or ["(no output)"])[-1]
    print("%-42s %6.1f s   %s" % (name, seconds, summary))
    for line in ran.stdout.splitlines():
        if line.startswith("FAILED"):
            print("    " + line)
    return seconds


def main():
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        tests = fetch_tests(scratch)
        (scratch / "pyvisor_as_ipython.py").write_text(SHIM)
        daemon, socket = rlm_envs.start_daemon(scratch / "daemon")
        try:
            env = dict(os.environ, PYVISOR_SOCKET=socket,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(scratch),
                                                                os.environ.get("PYTHONPATH")])))
            reference = run_tests("rlms IPythonREPL (subprocess kernel)", tests, env, [])
            pyvisor = run_tests("the same tests on PyvisorREPL", tests, env,
                                ["-p", "pyvisor_as_ipython"])
            print("PyvisorREPL took %.1f%% of the reference's time" % (100 * pyvisor / reference))
        finally:
            daemon.terminate()
            daemon.wait()


if __name__ == "__main__":
    main()
