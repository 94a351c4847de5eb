"""The synchronous client over the daemon's HTTP API (``[server] http``), with urllib only.

Each JSON-RPC method maps to its REST route (docs/protocol.md), so the Session of
``client.py`` works over HTTP unchanged, but for streaming: plain HTTP cannot stream, so a
``run`` with callbacks is refused (use the socket client), and ``input()`` in code run over
HTTP raises EOFError. ``session.files`` writes with one streamed ``PUT`` and reads with one
``GET`` (an append has no route: use the socket client). Errors come as ``{"error": {"code", "message"}}`` bodies and become
the same typed exceptions as on the socket.
"""

import json
import urllib.error
import urllib.parse
import urllib.request

from .client import _Sessions
from .errors import ConnectError, PyvisorError, ProtocolError, error_for

# Methods whose route is `POST /v1/sessions/{id}/<name>`, with the params less session_id
# as the body.
_POST_ON_SESSION = {
    "session.execute": "execute",
    "session.input": "input",
    "session.interrupt": "interrupt",
    "session.checkpoint": "checkpoint",
    "session.restore": "restore",
    "session.hint": "hint",
    "session.fork": "fork",
}


class HttpClient(_Sessions):
    """A client of the daemon at `base_url` (``http://127.0.0.1:8787``), with `token` as the
    bearer token when the daemon asks for one."""

    def __init__(self, base_url, token=None, timeout=None):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout

    def close(self):
        """Nothing to close: every call is a request of its own."""

    def call(self, method, params=None):
        """Calls `method` through its route; its result, or the RpcError of its error code."""
        params = dict(params or {})
        session = params.pop("session_id", None)
        if method in _POST_ON_SESSION:
            return self._request("POST", _session_path(session, _POST_ON_SESSION[method]), params)
        if method == "session.create":
            return self._request("POST", "/v1/sessions", params)
        if method == "session.list":
            return self._request("GET", "/v1/sessions" + _query(params))
        if method == "session.info":
            return self._request("GET", _session_path(session))
        if method == "session.checkpoints":
            return self._request("GET", _session_path(session, "checkpoints"))
        if method == "session.close":
            query = "?checkpoint=true" if params.get("checkpoint") else ""
            return self._request("DELETE", _session_path(session) + query)
        if method == "session.files.list":
            query = _query({"dir": params["path"]}) if params.get("path") else ""
            return self._request("GET", _session_path(session, "files") + query)
        if method == "session.files.remove":
            return self._request("DELETE", _file_path(session, params["path"]))
        if method == "engine.stats":
            return self._request("GET", "/v1/stats")
        if method == "engine.health":
            return self._request("GET", "/v1/health")
        raise PyvisorError("%s has no HTTP route in this client; use the socket client"
                           % method)

    def _write_file(self, session_id, path, data, append):
        if append:
            raise PyvisorError("an append has no HTTP route; use the socket client")
        return self._request("PUT", _file_path(session_id, path), raw=data)["size"]

    def _read_file(self, session_id, path, offset, length):
        data = self._request("GET", _file_path(session_id, path), decode=False)
        return data[offset:] if length is None else data[offset:offset + length]

    def _stream_execute(self, params, callbacks):
        raise PyvisorError("plain HTTP cannot stream output or answer input(); "
                           "run with callbacks through the socket client")

    def _request(self, verb, path, body=None, raw=None, decode=True):
        data = raw if raw is not None else (
            None if body is None else json.dumps(body).encode("utf-8"))
        request = urllib.request.Request(self.base_url + path, data=data, method=verb)
        if raw is not None:
            request.add_header("Content-Type", "application/octet-stream")
        elif data is not None:
            request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", "Bearer " + self._token)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as err:
            raise _http_error(err) from None
        except urllib.error.URLError as err:
            raise ConnectError("no pyvisor daemon at %s: %s" % (self.base_url, err.reason)) \
                from None
        if not decode:
            return text
        try:
            return json.loads(text) if text else {}
        except ValueError:
            raise ProtocolError("%s %s answered a body that is not JSON" % (verb, path)) \
                from None


def _session_path(session, action=None):
    path = "/v1/sessions/" + urllib.parse.quote(str(session), safe="")
    return path + "/" + action if action else path


def _file_path(session, path):
    return _session_path(session, "files/" + urllib.parse.quote(path, safe="/"))


def _query(params):
    return "?" + urllib.parse.urlencode(params) if params else ""


def _http_error(err):
    """The typed exception of an error answer, from its ``{"error": {...}}`` body."""
    try:
        error = json.loads(err.read())["error"]
        return error_for(error["code"], error["message"], error.get("data"))
    except (ValueError, KeyError, TypeError):
        return ProtocolError("HTTP %s without an error object" % err.code)
