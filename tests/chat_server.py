"""A local OpenAI-style /v1/chat/completions server (127.0.0.1, its own event loop in a thread) for tests of what
talks to a remote API, which these machines cannot reach. Subclasses answer in `handle(request)`."""

from __future__ import annotations

import asyncio
import threading

from flywheel.raycluster import free_port


def completion(model: str, content: str, logprobs: dict | None = None, **top) -> dict:
    """A chat.completion body answering `content` (top: more top-level fields, e.g. model_version)."""
    return {**top, "id": "x", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop",
                         "logprobs": logprobs}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


class ChatServer:
    def __init__(self):
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def handle(self, request):
        raise NotImplementedError

    def _run(self):
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
