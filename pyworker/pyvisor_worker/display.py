"""display() and pyplot figures: what the session's code shows the client besides its output.

The session's code has ``display(*objs)`` as a builtin, sending the richest of _repr_png_,
_repr_svg_, _repr_html_ and repr() of each object; pyplot figures still open at the end of an
execution are sent as PNG displays and closed (MPLBACKEND defaults to Agg). A display's data is
base64 for image/png and text for image/svg+xml, text/html and text/plain. In a speculative run
(see speculation) display() collects them instead of sending them.
"""

import base64
import io
import sys

from pyvisor_worker import protocol, state

_RICH_MIMES = (
    ("image/png", "_repr_png_"),
    ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"),
)


_sink = None  # a list that collects the displays instead, in a speculative run


def collect_displays(sink):
    """From now on, append each display to the list `sink` as {"mime", "data"}, unsent."""
    global _sink
    _sink = sink


def display(*objs):
    """Show each object in the client, in the richest format it offers (IPython's protocol)."""
    if _sink is not None:
        for obj in objs:
            mime, data = _display_data(obj)
            _sink.append({"mime": mime, "data": data})
        return
    execution_id = state.current_id
    if execution_id is None:  # no execution to show it in (a thread outliving its cell)
        return
    for obj in objs:
        mime, data = _display_data(obj)
        protocol.send({"type": "display", "id": execution_id, "mime": mime, "data": data})


def _display_data(obj):
    """(mime, data) of the richest representation `obj` offers, repr() as the last resort."""
    figure_module = sys.modules.get("matplotlib.figure")
    if figure_module is not None and isinstance(obj, figure_module.Figure):
        try:
            return _figure_png(obj)
        except Exception:
            return "text/plain", repr(obj)
    for mime, method in _RICH_MIMES:
        data = call_repr_method(obj, method)
        if isinstance(data, bytes) and mime == "image/png":
            return mime, base64.b64encode(data).decode("ascii")
        if isinstance(data, str):
            return mime, data
    return "text/plain", repr(obj)


def call_repr_method(obj, name):
    """What obj.<name>() returns; None when there is no such method or it fails."""
    if isinstance(obj, type):  # a class's _repr_*_ methods are for its instances
        return None
    try:
        method = getattr(obj, name, None)
        data = method() if callable(method) else None
    except Exception:
        return None
    if isinstance(data, tuple) and data:  # IPython also allows (data, metadata)
        data = data[0]
    return data


def _figure_png(figure):
    """A matplotlib figure as the (mime, data) of a PNG display."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return "image/png", base64.b64encode(buffer.getvalue()).decode("ascii")


def show_open_figures(execution_id):
    """Send the pyplot figures that the execution left open as PNG displays; close them."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        figures = [pyplot.figure(number) for number in pyplot.get_fignums()]
        pyplot.close("all")
    except Exception as exc:
        figures = []
        _send_note(execution_id, "could not collect the open pyplot figures", exc)
    for figure in figures:
        try:
            mime, data = _figure_png(figure)
        except Exception as exc:
            _send_note(execution_id, "could not render %r" % (figure,), exc)
        else:
            protocol.send({"type": "display", "id": execution_id, "mime": mime, "data": data})


def _send_note(execution_id, what, exc):
    """Tell the client in a text/plain display that the worker failed to do `what`."""
    data = "[pyvisor] %s: %s: %s" % (what, type(exc).__name__, exc)
    protocol.send({"type": "display", "id": execution_id, "mime": "text/plain", "data": data})
