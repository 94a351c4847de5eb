"""The model of the rlms tests: a loopback chat completions server (chat_server) whose
answers `reply(messages)` scripts, with what an RLM needs to use it, and the rlms library's
own LM handler in front of it, as an RLM starts one.
"""

from rlm.clients.openai import OpenAIClient
from rlm.core.lm_handler import LMHandler

from chat_server import ChatServer


class OpenAiServer(ChatServer):
    """A ChatServer whose answer is the content `reply(messages)` returns."""

    def __init__(self, reply):
        super().__init__(lambda body: reply(body["messages"]))

    def backend_kwargs(self):
        """What ``RLM(backend="openai", backend_kwargs=...)`` needs to use this server."""
        return {"base_url": self.url, "api_key": "test-key", "model_name": "fake-model",
                "max_retries": 0}

    def lm_handler(self):
        """A started LM handler of the rlms library whose client is this server."""
        handler = LMHandler(OpenAIClient(**self.backend_kwargs()))
        handler.start()
        return handler


def last_user_text(messages):
    """The content of the last user message."""
    return [m["content"] for m in messages if m["role"] == "user"][-1]
