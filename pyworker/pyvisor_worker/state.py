"""The worker's state that several modules read and rebind.

Other modules import this module and use ``state.name``, never ``from ... import name``, so
that all of them see a name rebound anywhere (the lock that a fork replaces, say).
"""

import builtins
import threading
import types

# The session's __main__ module: its dict is the namespace every cell runs in.
session = types.ModuleType("__main__")
session.__builtins__ = builtins
namespace = session.__dict__

# The functions, classes and lambdas that the session's cells (or a restore) defined, by name,
# in the order they were last defined: name -> (kind, source, value). A record counts only while
# its name is still bound to its value; the control thread reads it for inspect.
definitions = {}

MISSING = object()  # the value of a name that is not bound

# For incremental checkpoints (see versions): the names that cells could have changed since the
# last checkpoint, or all of them; and the record of each group the worker last wrote or
# restored: {"token", "names", "bytes", "ids", "fingerprints"}.
touched = set()
touched_all = False
checkpoint_records = []
# name -> (id of its value, the ids of the objects it holds), for long walks (see versions).
identity_cache = {}
MAIN_THREAD = threading.get_ident()

# Which execution runs, for the control thread to route an interrupt (see Interrupts in
# execution); the main thread changes current_id under the lock, which the control thread holds
# from its check to its SIGINT.
execution_lock = threading.Lock()
current_id = None  # id of the running execution; other threads read it
# The id of the last interrupt that named no running execution: one the main thread has not
# read yet ends as soon as it is taken up.
interrupted_early = None
input_waiting_for = None  # id of the execution whose input() waits for an answer

# What the SIGINT handler does: "raise" while the session's code runs on the main thread,
# "defer" while that code has the main thread write a frame, "ignore" otherwise.
sigint_action = "ignore"
sigint_deferred = False


def is_user_name(name):
    """Whether `name` is one of the session's own names, not a dunder such as __builtins__."""
    return type(name) is str and not (name.startswith("__") and name.endswith("__"))

# In a clone (see cloning): what its first execution tells the code's stderr, once.
fork_note = None
