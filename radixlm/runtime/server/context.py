"""AppContext: what the HTTP routes need, and how a route gets it (a FastAPI dependency); blocking work
(tokenization, chat templating) goes to one worker thread so the event loop keeps serving.

Runs in the HTTP process.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, TypeVar

from fastapi import Depends, Request

from radixlm.runtime.config import GrammarConfig, ServerConfig
from radixlm.runtime.server.tokenizer_manager import TokenizerManager

T = TypeVar("T")
# One thread: the tokenizer is shared, and a fast tokenizer used from two threads at once can fail
# ("Already borrowed"); one thread still takes the work off the event loop.
_BLOCKING = ThreadPoolExecutor(1, thread_name_prefix="radixlm-tokenize")


@dataclass(frozen=True)
class AppContext:
    tm: TokenizerManager
    config: ServerConfig
    model_info: dict[str, Any]  # from the scheduler's ready handshake
    tokenizer_path: str
    served_model_name: str
    server_args: dict[str, Any]
    grammar_config: GrammarConfig = field(default_factory=GrammarConfig)  # strict response_format checks


def app_context(request: Request) -> AppContext:
    return request.app.state.ctx


Ctx = Annotated[AppContext, Depends(app_context)]


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) on the tokenizer thread; its exception is raised here."""
    return await asyncio.get_running_loop().run_in_executor(_BLOCKING, functools.partial(fn, *args, **kwargs))
