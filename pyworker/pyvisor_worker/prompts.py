"""input() and getpass.getpass() for the session's code: the client asks its user.

Each call sends an input request for the running execution and waits for the input_reply
that the control thread routes to it; a null value, or no running execution, makes it EOFError.
"""

import threading

from pyvisor_worker import protocol, state

_input_lock = threading.Lock()


def input(prompt=""):
    """input() for the session's code: the client shows the prompt and answers the line."""
    return _ask(str(prompt), False)


def getpass(prompt="Password: ", stream=None):
    """getpass.getpass() for the session's code: the client asks without echoing."""
    return _ask(str(prompt), True)


def _ask(prompt, password):
    """Send an input request for the running execution; return the client's answer."""
    with _input_lock:
        while not protocol.input_replies.empty():  # answers to earlier, interrupted requests
            protocol.input_replies.get_nowait()
        execution_id = state.input_waiting_for = state.current_id
        try:
            # Checked after announcing the wait: an execution that ends from now on wakes us.
            if execution_id is None or state.current_id != execution_id:
                raise EOFError("EOF when reading a line")
            protocol.send({
                "type": "input_request",
                "id": execution_id,
                "prompt": prompt,
                "password": password,
            })
            value = protocol.input_replies.get()
        finally:
            state.input_waiting_for = None
    if value is None:
        raise EOFError("EOF when reading a line")
    return value
