"""The built-in agent's model endpoint: one chat completion at a time from any OpenAI-compatible
server, in that server's dialect, and what to do when it cannot answer.

Servers differ where the agent meets them: OpenAI, vLLM, llama.cpp's server, llama-cpp-python,
Ollama and NIM all take Chat Completions with tools, but not all take an assistant turn whose
`content` is null (the agent always sends a string), not all take `max_tokens` (newer OpenAI
models want `max_completion_tokens`: switched on the first refusal that says so), and only some say
their window (vLLM's /v1/models `max_model_len`, llama.cpp's /props `n_ctx`).

Retries are ours, not the SDK's, so that each failure is judged by what retrying can do:
- a dropped connection, a request past GOALTENDER_OPENAI_TIMEOUT_S, HTTP 408/409/429/502/503/504
  and a malformed 200 are retried (with backoff, honouring Retry-After) up to
  GOALTENDER_OPENAI_MAX_RETRIES times;
- another 5xx is retried until it repeats itself word for word: the same answer twice is the
  server's verdict on this request (a validation error), not a passing fault;
- any other 4xx is not retried;
- a request the server finds too long raises ContextOverflow with the numbers it gave, for the
  agent to compact below them.
A failure is said in the server's own words (error.message, detail, or the body).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from goaltender.agents.blocking import AgentFailure
from goaltender.agents.tool_output import one_line
from goaltender.runner.secrets import url_shown

if TYPE_CHECKING:
    import logging

    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

TRANSIENT_STATUS = {408, 409, 429, 502, 503, 504}  # retrying may help
WORDS_IN_TITLE = 240  # of the server's words in the goal's milestone title; all of them in its detail
WORDS_KEPT = 4000

# How servers say a request is longer than the window, and the numbers they give with it.
_TOO_LONG = re.compile(
    r"context|too long|too many tokens|maximum.{0,40}length|exceeds?|n_ctx|max_model_len|prompt is too", re.I
)
_WINDOW_NUMBERS = (
    re.compile(r"maximum context length is (\d+)", re.I),  # OpenAI, vLLM
    re.compile(r"context (?:window|size|length) (?:of|is) \(?(\d+)", re.I),  # llama-cpp-python, others
    re.compile(r"n_ctx\W{0,4}(\d+)", re.I),  # llama.cpp's server: {"n_ctx": 8192, ...}
    re.compile(r"max_model_len\W{0,4}(\d+)", re.I),
)
_PROMPT_NUMBERS = (
    re.compile(r"n_prompt_tokens\W{0,4}(\d+)", re.I),
    re.compile(r"\((\d+) in the messages", re.I),  # OpenAI's wording, as llama-cpp-python copies it
    re.compile(r"requested (?:tokens \()?(\d+)", re.I),
    re.compile(r"your (?:messages|prompt) resulted in (\d+)", re.I),
)


class EndpointFailure(AgentFailure):
    """The model endpoint cannot serve us: the goal fails with this message."""


class MalformedReply(Exception):
    """A 200 from the endpoint that is not a usable chat completion (said as 'a reply without ...')."""


@dataclass
class ContextOverflow(Exception):
    """The server refused the request as longer than its window; what it said and the numbers."""

    words: str
    window: int | None  # the window the server named, if it did
    prompt: int | None  # the request's tokens as the server counted them, if it did

    def __str__(self) -> str:
        return self.words


@dataclass(frozen=True)
class Sampling:
    """What each request asks of the model beyond its messages; None: the server's default."""

    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None


class ChatEndpoint:
    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str,
        model: str,
        shown: str,
        timeout_s: float,
        max_retries: int,
        log: logging.Logger,
    ):
        import openai  # slow to import: after the signal handlers and the runner connection

        self.model = model
        self.shown = shown  # the endpoint as logs and milestones name it: no credentials
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.log = log
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,
            timeout=openai.Timeout(timeout_s, connect=min(10.0, timeout_s)),
        )
        self.output_param = "max_tokens"  # or max_completion_tokens, once a server asks for it

    async def close(self) -> None:
        await self.client.close()

    # ---- one completion ----

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[Any], sampling: Sampling
    ) -> ChatCompletion:
        """A usable reply, or EndpointFailure / ContextOverflow (see the module's docstring)."""
        import openai

        failures = 0
        last_words: str | None = None
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    response = await self.client.chat.completions.create(
                        model=self.model,
                        messages=cast("list[ChatCompletionMessageParam]", messages),
                        tools=tools,
                        tool_choice="auto",
                        **self._sampling(sampling),
                    )
                if problem := reply_problem(response):
                    raise MalformedReply(problem)
                return response
            except openai.APIStatusError as exc:
                words = server_words(exc)
                if self._switch_output_param(exc.status_code, words):
                    continue
                if _too_long(exc.status_code, words):
                    raise ContextOverflow(
                        words, _number(_WINDOW_NUMBERS, words), _number(_PROMPT_NUMBERS, words)
                    ) from exc
                repeated = exc.status_code >= 500 and words == last_words
                if exc.status_code not in TRANSIENT_STATUS and (exc.status_code < 500 or repeated):
                    raise self._refused(exc.status_code, words, repeated) from exc
                last_words, why = words, f"HTTP {exc.status_code}: {words}"
                delay = _retry_after(exc.response)
                malformed = False
            except openai.APIConnectionError as exc:  # also APITimeoutError
                why, delay, malformed = _error_text(exc), None, False
            except TimeoutError:
                why = f"no complete answer within {self.timeout_s:g}s (GOALTENDER_OPENAI_TIMEOUT_S)"
                delay, malformed = None, False
            except (MalformedReply, json.JSONDecodeError) as exc:
                why = (
                    str(exc) if isinstance(exc, MalformedReply) else f"a reply that is not valid JSON ({exc})"
                )
                delay, malformed = None, True
            failures += 1
            if failures > self.max_retries:
                raise self._gave_up(why, malformed)
            self.log.info("retrying the request (%d of %d): %s", failures, self.max_retries, why)
            await asyncio.sleep(delay if delay is not None else min(8.0, 0.5 * 2 ** (failures - 1)))

    def _sampling(self, sampling: Sampling) -> dict[str, Any]:
        asked: dict[str, Any] = {}
        if sampling.max_output_tokens is not None:
            asked[self.output_param] = sampling.max_output_tokens
        for name in ("temperature", "top_p", "seed"):
            if (value := getattr(sampling, name)) is not None:
                asked[name] = value
        return asked

    def _switch_output_param(self, status: int, words: str) -> bool:
        """OpenAI's newer models refuse max_tokens and name max_completion_tokens: use that."""
        if status == 400 and self.output_param == "max_tokens" and "max_completion_tokens" in words:
            self.log.info("the endpoint asks for max_completion_tokens instead of max_tokens: switching")
            self.output_param = "max_completion_tokens"
            return True
        return False

    def _refused(self, status: int, words: str, repeated: bool) -> EndpointFailure:
        hint = {
            401: " (check OPENAI_API_KEY)",
            403: " (check OPENAI_API_KEY and the model's access)",
            404: " (check OPENAI_BASE_URL, which usually ends in /v1, and GOALTENDER_MODEL)",
        }.get(status, "")
        again = ", the same answer twice" if repeated else ""
        return EndpointFailure(
            f"Model endpoint refused the request (HTTP {status}{again}): {self.shown}: "
            f"{one_line(words, WORDS_IN_TITLE)}{hint}",
            f"The server said: {words}\nModel {self.model}; not retried: retrying cannot change this answer.",
        )

    def _gave_up(self, why: str, malformed: bool) -> EndpointFailure:
        """Why the endpoint could not answer, once the retries are used up: it answered with
        something unusable (`malformed`), or not at all."""
        after = f"after {self.max_retries} retries; model {self.model}"
        if malformed:
            return EndpointFailure(
                f"Model endpoint returned {one_line(why, WORDS_IN_TITLE)}: {self.shown}", after
            )
        return EndpointFailure(
            f"Model endpoint unreachable: {self.shown}: {one_line(why, WORDS_IN_TITLE)}", f"{why}\n{after}"
        )

    # ---- what the server says of itself ----

    async def window(self) -> tuple[int, str] | None:
        """The server's context window and where it said so: vLLM's /v1/models `max_model_len`
        (and `context_length` / `context_window`, as some proxies name it), llama.cpp's /props
        `n_ctx`. None when it does not say (OpenAI, llama-cpp-python, Ollama)."""
        import openai

        client = self.client.with_options(timeout=5.0)  # its key and headers; a short wait
        base = str(client.base_url).rstrip("/")
        for url, read in (
            (f"{base}/models", self._window_in_models),
            (f"{base.removesuffix('/v1')}/props", _window_in_props),
        ):
            try:
                found = read(await client.get(url, cast_to=object))
            except (openai.APIError, ValueError) as exc:
                self.log.info("could not read %s: %s", url_shown(url), exc or type(exc).__name__)
                continue
            if found:
                return found, url.removeprefix(base.removesuffix("/v1"))
        return None

    def _window_in_models(self, body: Any) -> int | None:
        models = body.get("data") if isinstance(body, dict) else None
        for model in models if isinstance(models, list) else []:
            if isinstance(model, dict) and model.get("id") == self.model:
                for key in ("max_model_len", "context_length", "context_window", "max_context_length"):
                    if isinstance(model.get(key), int) and model[key] > 0:
                        return int(model[key])
        return None


def _window_in_props(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    for value in (settings.get("n_ctx") if isinstance(settings, dict) else None, body.get("n_ctx")):
        if isinstance(value, int) and value > 0:
            return value
    return None


def server_words(exc: openai.APIStatusError) -> str:
    """What the server said of the failure: its error.message, a `detail`, or the body."""
    body: Any = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            body = error.get("message") or error.get("detail") or body.get("detail") or error
        elif error:
            body = error
    text = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
    if not text.strip():
        text = getattr(exc.response, "text", "") or str(exc)
    return " ".join(text.split())[:WORDS_KEPT]


def _too_long(status: int, words: str) -> bool:
    return status in (400, 413, 422, 500) and bool(_TOO_LONG.search(words)) and "token" in words.lower()


def _number(patterns: tuple[re.Pattern[str], ...], words: str) -> int | None:
    for pattern in patterns:
        if found := pattern.search(words):
            return int(found.group(1))
    return None


def _retry_after(response: Any) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, retry-after), at most 60."""
    headers = getattr(response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            return min(60.0, max(0.0, float(headers[name]) / scale))
        except (KeyError, ValueError, TypeError):
            continue
    return None


def reply_problem(response: Any) -> str | None:
    """What makes a reply unusable ("a reply without choices", ...), or None. The SDK does not
    validate replies: a proxy's page, or a server's odd JSON, arrives as is."""
    choices = getattr(response, "choices", None)
    if not choices or not isinstance(choices, list):
        return f"a reply without choices ({one_line(response, 200)})"
    message = getattr(choices[0], "message", None)
    if message is None:
        return "a choice without a message"
    for call in getattr(message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        if not isinstance(getattr(function, "name", None), str):
            return "a tool call without a function name"
    return None


def _error_text(exc: BaseException) -> str:
    """The exception and its causes, e.g. 'Connection error. (ConnectError: [Errno 111] ...)'."""
    text = str(exc) or type(exc).__name__
    cause, seen = exc.__cause__ or exc.__context__, 0
    while cause is not None and seen < 4:
        if str(cause) and str(cause) not in text:
            text += f" ({type(cause).__name__}: {cause})"
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return one_line(text, WORDS_KEPT)
