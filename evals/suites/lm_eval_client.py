"""The lm-eval client side shared by the lm-eval suites (gsm8k and the generic `lm-eval` suite).

lm-eval's `local-completions` (or `local-chat-completions`) model, subclassed so that a run
sees every request: it reports each answer to a `Listener` as it arrives (progress, samples),
checks the run's stop flag right before each request, and answers generation prompts that an
earlier attempt of the run already stored (`context.done_samples`) without asking the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from evals.suites.base import SuiteAborted, SuiteContext

EMIT_EVERY = 32
EMIT_INTERVAL_S = 2.0
STOP_POLL_S = 0.2


class Listener(Protocol):
    """What the observed model tells: the requests it will send, and each answer as it comes."""

    context: SuiteContext

    def expect(self, instances: Sequence[Any]) -> Mapping[str, str]:
        """Note the requests of one batch; return answers already known, by prompt."""
        ...

    def on_answer(self, kind: str, prompt: str, response: Any) -> None: ...


class Stopped(BaseException):
    """The run's stop flag was seen. A BaseException so lm-eval's retry loop (which retries
    every Exception) lets it through at once instead of retrying it."""


async def _stop_seen(context: SuiteContext) -> None:
    """Returns once the run's stop flag is set (engine dead or run cancelled)."""
    while not context.should_stop():
        await asyncio.sleep(STOP_POLL_S)


@contextlib.contextmanager
def lm_eval_log_to(path: Path) -> Iterator[None]:
    """lm-eval's log lines (one retry warning per failed request) go to the suite's folder.

    A run's terminal and the service's log show the run's progress and result; what lm-eval
    said is kept beside its samples for whoever needs it.
    """
    logger = logging.getLogger("lm_eval")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [handler], False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved
        handler.close()


def evaluate(context: SuiteContext, suite: str, done: Callable[[], str], **arguments: Any) -> Any:
    """lm-eval's `simple_evaluate`, its log in the suite's folder; a stop or a dead engine becomes
    SuiteAborted saying how far it got (`done()`, e.g. "12 of 200 answers")."""
    from lm_eval import simple_evaluate

    try:
        with lm_eval_log_to(context.work_dir / "lm_eval.log"):
            return simple_evaluate(**arguments)
    except Stopped:
        raise SuiteAborted(f"{suite}: stopped after {done()}") from None
    except Exception as exc:
        if context.should_stop():
            raise SuiteAborted(f"{suite}: the engine went away after {done()}: {exc}") from exc
        raise


def known_answers(context: SuiteContext) -> dict[str, str]:
    """Generated answers an earlier attempt stored, keyed by the exact prompt they were given for.

    Samples stored without a prompt (log-likelihood items, scored from several requests) are
    not reusable and are asked again.
    """
    return {
        s.prompt: s.response
        for s in context.done_samples.values()
        if s.prompt and s.error is None and hashlib.sha256(s.prompt.encode()).hexdigest() == s.prompt_hash
    }


def observed_model_class(chat: bool = False) -> type:
    """`local-completions` (or `local-chat-completions` when `chat`) wired to a `Listener`."""
    from lm_eval.api.model import CacheHook
    from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

    base: type = LocalChatCompletion if chat else LocalCompletionsAPI

    class AnswerHook(CacheHook):
        """lm-eval calls its cache hook once per answer, as it arrives, on every request path."""

        def __init__(self, listener: Listener) -> None:
            super().__init__(None)
            self.listener = listener

        def add_partial(self, attr: str, req: Any, res: Any) -> None:
            self.listener.on_answer(attr, req[0], res)

    class ObservedModel(base):
        def __init__(self, listener: Listener, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.set_cache_hook(AnswerHook(listener))
            self._listener = listener
            self._gate: asyncio.Semaphore | None = None

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            known = self._listener.expect(requests)
            todo = [r for r in requests if r.args[0] not in known]
            fresh = iter(super().generate_until(todo, disable_tqdm) if todo else [])
            return [known[r.args[0]] if r.args[0] in known else next(fresh) for r in requests]

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            self._listener.expect(requests)
            return list(super().loglikelihood(requests, disable_tqdm))

        def model_call(self, messages: Any, **kwargs: Any) -> Any:
            if self._listener.context.should_stop():
                raise Stopped
            return super().model_call(messages, **kwargs)

        async def get_batched_requests(self, requests: list[Any], cache_keys: list[Any], **kwargs: Any) -> Any:
            # lm-eval takes its semaphore inside amodel_call, after our check could run;
            # this gate of the same size makes the stop check happen right before sending.
            self._gate = asyncio.Semaphore(self._concurrent)
            return await super().get_batched_requests(requests, cache_keys, **kwargs)

        async def amodel_call(self, session: Any, sem: Any, messages: Any, **kwargs: Any) -> Any:
            assert self._gate is not None
            async with self._gate:
                if self._listener.context.should_stop():
                    raise Stopped
                call = asyncio.ensure_future(super().amodel_call(session, sem, messages, **kwargs))
                stopped = asyncio.ensure_future(_stop_seen(self._listener.context))
                await asyncio.wait({call, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if call.done():
                    stopped.cancel()
                    return call.result()
                call.cancel()  # lm-eval would retry a dead engine max_retries times, with backoff
                raise Stopped

    return ObservedModel
