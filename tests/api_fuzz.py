"""Fuzzing the HTTP API, shared by the fast tests (the app over a scripted engine) and the real
ones (`tandem serve` on the small model).

Two sources of hostile input:
- schemathesis over the server's own /openapi.json: bodies, path and query parameters drawn from
  the schema (positive) and from its negation (negative: wrong types, out-of-range numbers,
  missing fields), half of the bodies with the served model's name so they reach the engine;
- hypothesis strategies for what a schema cannot say: raw bytes that are almost OpenAI bodies
  (nested messages, stop lists, the `tandem` object) with lone surrogate escapes, duplicate keys,
  huge and non-finite numbers, deep nesting, invalid UTF-8 and truncated JSON.

Every response must be below 500, every 4xx an OpenAI error object, and every 200 a completion
(or an SSE stream ending in [DONE]); the server must still answer /health afterwards.
"""

import json
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis import strategies as st

FUZZ_SETTINGS = dict(suppress_health_check=list(HealthCheck), deadline=None, database=None, derandomize=True)


@dataclass
class FuzzTally:
    statuses: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(self.statuses.values())

    def record(self, what: str, status: int, content_type: str, body: bytes) -> None:
        self.statuses[status] += 1
        problem = response_problem(status, content_type, body)
        if problem and len(self.problems) < 20:
            self.problems.append(f"{what} -> {status}: {problem}")


def response_problem(status: int, content_type: str, body: bytes) -> str | None:
    if status >= 500:
        return f"server error: {body[:300]!r}"
    if 400 <= status < 500:
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"4xx body is not an OpenAI error: {body[:300]!r}"
        if not (isinstance(error.get("message"), str) and isinstance(error.get("type"), str)
                and "param" in error and "code" in error):
            return f"4xx error object lacks message/type/param/code: {error}"
    if status == 200 and content_type.startswith("text/event-stream") and not body.rstrip().endswith(b"[DONE]"):
        return f"stream did not end with [DONE]: {body[-200:]!r}"
    return None


# -- schemathesis --------------------------------------------------------------------------------

def fuzz_schema(schema, model: str, examples: int, call, tally: FuzzTally) -> None:
    """Every operation of `schema`, positive and negative, `examples` cases each (GETs a quarter)."""
    from schemathesis.generation import GenerationMode

    for result in schema.get_all_operations():
        operation = result.ok()
        budget = examples if operation.method.upper() == "POST" else max(5, examples // 4)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            cases = st.tuples(operation.as_strategy(generation_mode=mode), st.booleans()).map(
                lambda pair: _served(pair[0], model) if pair[1] else pair[0])

            @settings(max_examples=budget, **FUZZ_SETTINGS)
            @given(case=cases)
            def run(case):
                response = call(case)
                content_type = response.headers.get("content-type", "")
                if isinstance(content_type, list):  # schemathesis keeps every value of a header
                    content_type = content_type[0] if content_type else ""
                tally.record(f"{case.method} {case.formatted_path} {case.body!r:.300}", response.status_code,
                             content_type, response.content)

            try:
                run()
            except Unsatisfiable:  # nothing to negate: an operation without parameters or body
                assert mode == GenerationMode.NEGATIVE, operation.path


def _served(case, model: str):
    """The case with the served model's name, and short answers, so it reaches the engine."""
    if isinstance(case.body, dict):
        case.body = {**case.body, "model": model}
        for name in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(name), int) and case.body[name] > 4:
                case.body[name] = 4
    return case


# -- raw bodies ----------------------------------------------------------------------------------

class Raw:
    """A JSON fragment written as is (an escape, a duplicate key, a huge number)."""

    def __init__(self, text: str):
        self.text = text


def write(value) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{write(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write(v) for v in value) + "]"
    return json.dumps(value, allow_nan=True)


def _strings() -> st.SearchStrategy:
    escapes = st.sampled_from(['"\\ud83d"', '"\\udc00x"', '"a\\ud800\\ud800"', '"\\u0000"', '"\\ud83d\\ude42"'])
    return st.one_of(st.text(max_size=30), escapes.map(Raw), st.just("\u202e\ufeff"), st.just(""))


def _numbers() -> st.SearchStrategy:
    huge = st.sampled_from(["1e400", "-1e400", "1" + "0" * 5000, "NaN", "Infinity", "-0", "1.0", "2e-400",
                            "9223372036854775808", "-1"]).map(Raw)
    return st.one_of(st.integers(), st.floats(allow_nan=False), huge)


def _anything() -> st.SearchStrategy:
    leaves = st.one_of(st.none(), st.booleans(), _numbers(), _strings())
    return st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=12)


def _message() -> st.SearchStrategy:
    content = st.one_of(_strings(), st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                                                                    "text": _strings()}), max_size=3), _anything())
    return st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool",
                                                                    "developer", "robot"]), _anything()),
                                  "content": content})


def _hostile_fields(model: str) -> dict[str, st.SearchStrategy]:
    return {
        "model": st.one_of(st.just(model), _strings()),
        "messages": st.one_of(st.lists(_message(), max_size=4), _anything()),
        "prompt": st.one_of(_strings(), st.lists(_strings(), max_size=3), _anything()),
        "max_tokens": st.one_of(st.integers(-2, 10), _numbers(), _anything()),
        "temperature": st.one_of(_numbers(), _anything()),
        "top_p": _numbers(), "top_k": _numbers(), "seed": _numbers(), "n": _numbers(),
        "stop": st.one_of(_strings(), st.lists(_strings(), max_size=20), _anything()),
        "stream": st.one_of(st.booleans(), _anything()),
        "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": _anything()}), _anything()),
        "tandem": st.one_of(st.fixed_dictionaries({"drafter": _anything(), "k": _numbers()}), _anything()),
        "logit_bias": st.one_of(st.dictionaries(st.text(max_size=4), _numbers(), max_size=3), _anything()),
    }


@st.composite
def raw_request(draw, model: str) -> tuple[str, bytes]:
    """(path, body bytes): a valid request with up to three fields made hostile, then maybe twisted."""
    chat = draw(st.booleans())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    text = draw(st.text(min_size=1, max_size=40))
    body = {"model": model, "max_tokens": draw(st.integers(1, 4)), "temperature": 0,
            "stream": draw(st.booleans()), **({"messages": [{"role": "user", "content": text}]} if chat
                                               else {"prompt": text})}
    hostile = _hostile_fields(model)
    for name in draw(st.lists(st.sampled_from(sorted(hostile)), max_size=3, unique=True)):
        body[name] = draw(hostile[name])
    data = write(body)
    twist = draw(st.sampled_from(["none", "none", "none", "duplicate", "nest", "truncate", "bad-utf8", "array"]))
    if twist == "duplicate":
        data = data[:-1] + ',"model":1,"model":' + json.dumps(model) + "}"
    elif twist == "nest":
        data = '{"messages":' + "[" * 5000 + "]" * 5000 + "}"
    elif twist == "truncate":
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    elif twist == "array":
        data = "[" + data + "]"
    encoded = data.encode("utf-8", errors="surrogatepass")
    if twist == "bad-utf8":
        encoded = encoded.replace(b':"', b':"\xff\xfe', 1) if b':"' in encoded else encoded[:-1] + b"\xff}"
    return path, encoded


def fuzz_raw(model: str, examples: int, post, tally: FuzzTally) -> None:
    @settings(max_examples=examples, **FUZZ_SETTINGS)
    @given(request=raw_request(model))
    def run(request):
        path, data = request
        response = post(path, data)
        tally.record(f"POST {path} {data[:300]!r}", response.status_code, response.headers.get("content-type", ""),
                     response.content)

    run()
