"""pyvisor worker: runs the Python code of one pyvisor session, as a pyvisor host's child.

The host runs the directory that holds this package, whose ``__main__.py`` calls
``pyvisor_worker.main.run()``. Standard library only; Python 3.9 or newer. ``protocol``
documents how the host and the worker talk; each module documents its own part.
"""
