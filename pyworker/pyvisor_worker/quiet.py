"""The worker's own work on the session's objects, kept out of the session's warnings.

Facts and adopt checks call into the session's libraries (pandas summaries, fingerprints of
frames); a warning those calls raise would be printed on the session's stderr. ``quiet()`` runs
such work with every warning ignored. It may empty the session's warning registries: that
costs nothing, as every execution starts with them empty (see execution).
"""

import contextlib
import warnings


@contextlib.contextmanager
def quiet():
    """Run the body with every warning ignored, then put the filters back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
