"""The worker's own work on the session's objects, kept out of the session's warnings.

Facts and adopt checks call into the session's libraries (pandas summaries, fingerprints of
frames). Two things there would change what the session's code later sees: a warning those
calls raise would be printed on the session's stderr, and the ``warnings.catch_warnings()``
that pandas uses internally marks the warning filters as changed, which empties every
``__warningregistry__``, so a warning the session's code already saw once is printed again.
``quiet()`` runs such work with every warning ignored and the filters' change counter left
alone, then puts the filters back as they were: the session's registries stay valid.
"""

import contextlib
import warnings

_IGNORE_ALL = ("ignore", None, Warning, None, 0)


@contextlib.contextmanager
def quiet():
    """Run the body with warnings ignored and the session's warning registries kept."""
    filters = warnings.filters
    saved = filters[:]
    mutated = warnings._filters_mutated
    warnings._filters_mutated = _unchanged
    filters[:] = [_IGNORE_ALL]
    try:
        yield
    finally:
        warnings.filters = filters  # a catch_warnings() left open would have rebound it
        filters[:] = saved
        warnings._filters_mutated = mutated


def _unchanged():
    """Stands in for warnings._filters_mutated() while quiet."""
