"""A chat completions server on loopback, for tests whose model is a remote provider (the one
thing that cannot run here): `answer(body)` gives the assistant message of each request
(a dict, or a string for its content); every request is kept as (path, Authorization, body).
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    """Serves ``POST /v1/chat/completions`` at ``url`` with what ``answer(body)`` returns."""

    def __init__(self, answer):
        self.requests = []
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append((self.path, self.headers.get("Authorization"), body))
                    count = len(server.requests)
                message = answer(body)
                if isinstance(message, str):
                    message = {"role": "assistant", "content": message}
                reply = json.dumps({
                    "id": "chatcmpl-%d" % count, "object": "chat.completion", "created": 0,
                    "model": body.get("model", ""),
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = "http://127.0.0.1:%d/v1" % self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def bodies(self):
        """The JSON bodies of the requests so far."""
        return [body for _, _, body in self.requests]

    def stop(self):
        self._http.shutdown()
        self._http.server_close()
