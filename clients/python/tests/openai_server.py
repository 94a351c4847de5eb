"""A local OpenAI-compatible chat-completions server on loopback for the rlms tests: the
remote provider is the one thing that cannot run here. `reply(messages)` scripts its
answers; it records every request. Also the LM handler of the rlms library in front of it,
as an RLM starts one.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rlm.clients.openai import OpenAIClient
from rlm.core.lm_handler import LMHandler


class OpenAiServer:
    """Serves ``POST /v1/chat/completions`` with what ``reply(messages)`` returns."""

    def __init__(self, reply):
        self.reply = reply
        self.requests = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests.append(body)
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": "no route " + self.path}})
                text = server.reply(body["messages"])
                self._send(200, {
                    "id": "chatcmpl-%d" % len(server.requests), "object": "chat.completion",
                    "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})

            def _send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.base_url = "http://127.0.0.1:%d/v1" % self._http.server_address[1]
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def backend_kwargs(self):
        """What ``RLM(backend="openai", backend_kwargs=...)`` needs to use this server."""
        return {"base_url": self.base_url, "api_key": "test-key", "model_name": "fake-model",
                "max_retries": 0}

    def lm_handler(self):
        """A started LM handler of the rlms library whose client is this server."""
        handler = LMHandler(OpenAIClient(**self.backend_kwargs()))
        handler.start()
        return handler

    def stop(self):
        self._http.shutdown()
        self._http.server_close()


def last_user_text(messages):
    """The content of the last user message."""
    return [m["content"] for m in messages if m["role"] == "user"][-1]
