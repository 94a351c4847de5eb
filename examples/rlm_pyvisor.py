"""A recursive language model (the rlms library) whose REPL is a pyvisor session: one RLM
completion over a context file, with ``environment="pyvisor"``, against any
OpenAI-compatible chat completions API.

    export OPENAI_API_KEY=...            # or any OpenAI-compatible server's key
    python3 examples/rlm_pyvisor.py notes.txt "Which dates does this mention?"

Settings: ``$OPENAI_BASE_URL`` (default https://api.openai.com/v1), ``$OPENAI_MODEL``
(default gpt-4o-mini), ``--max-depth`` (2 lets the model's ``rlm_query`` run a child RLM in a
REPL of its own), ``--cell-timeout`` (seconds per cell), ``--socket`` (else
``$PYVISOR_SOCKET``, the default socket, or a child ``pyvisor serve --stdio``). Needs
``pip install './clients/python[rlm]'``.
"""

import argparse
import os

from rlm import RLM

from pyvisor_client.rlm import register


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("context", help="a text file: the RLM's context")
    parser.add_argument("question", help="what to answer about it")
    parser.add_argument("--max-depth", type=int, default=1)
    parser.add_argument("--max-iterations", type=int, default=12)
    parser.add_argument("--cell-timeout", type=float, default=60.0)
    parser.add_argument("--socket")
    args = parser.parse_args()
    with open(args.context, encoding="utf-8") as file:
        context = file.read()

    register()  # RLM(environment="pyvisor") now builds a PyvisorREPL
    backend_kwargs = {
        "model_name": os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        "base_url": os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        "api_key": os.environ.get("OPENAI_API_KEY"),
    }
    environment_kwargs = {"cell_timeout": args.cell_timeout}
    if args.socket:
        environment_kwargs["socket"] = args.socket
    rlm = RLM(backend="openai", backend_kwargs=backend_kwargs, environment="pyvisor",
              environment_kwargs=environment_kwargs, max_depth=args.max_depth,
              max_iterations=args.max_iterations)
    result = rlm.completion(context, root_prompt=args.question)
    print(result.response)


if __name__ == "__main__":
    main()
