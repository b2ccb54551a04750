"""Device profiles: what scoring tokens costs one model on one device, as cost curves.

A `Curve` gives, for `batch` sequences each holding `context` cached tokens, the ms one forward
call takes to score n new tokens per sequence (n = k + 1 when verifying k draft tokens; n = 1
when drafting or decoding plainly). A `DeviceProfile` holds curves over several batches and
contexts for one (model, backend, device, dtype, threads), and says where they come from:
`measured` (`tandem profile`, see measure.py) or `public-spec` (derived from a device's published
peak FLOP/s and memory bandwidth by a roofline, see public_profiles.py; it carries a citation).

Between measured batches and contexts `step_ms` interpolates linearly; past the largest batch it
prices the total token count on the largest batch's curve (B sequences of n tokens cost what
B_max sequences of n·B/B_max tokens cost); contexts outside the measured range are clamped.
The planner and the simulator read these; an engine plans on its own runner's curve
(models/backends.py's cached profile, refined from observed step times while serving).

The curves ask logits at every new position, as a verification does. A prompt needs them at its
last position at most, and on a large vocabulary every logits row costs (the output matrix and
its copy): one llama.cpp thread on the 0.5B scored 64 tokens with 64 rows in 1,401 ms and with
one row in 755 ms. So a measured profile also holds `prompt_ms`: one
sequence, starting from an empty cache, scoring n prompt tokens with logits at the last one only
(`prompt_cost()`; empty in older and public-spec profiles, where the curves stand in for it).

Every point is its fastest sample (measure.py); `typical_over_fastest` says how much slower the
device typically ran while profiled (None in older and public-spec profiles: read as 1).
"""

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

from tandem.errors import TandemError
from tandem.models.cost import CostModel
from tandem.paths import write_text_atomic

SOURCES = ("measured", "public-spec")
FORMAT = 1  # profile file format version


@dataclass(frozen=True, slots=True)
class Curve:
    batch: int  # sequences per forward call
    context: int  # cached tokens per sequence before the call
    latency_ms: tuple[tuple[int, float], ...]  # (n new tokens per sequence, ms), n ascending
    _cost: CostModel = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.batch < 1 or self.context < 0:
            raise TandemError(f"curve: batch must be >= 1 and context >= 0 (got {self.batch}, {self.context})")
        sizes = [n for n, _ in self.latency_ms]
        if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise TandemError(f"curve batch={self.batch} context={self.context}: n must be distinct, "
                              f">= 1 and ascending (got {sizes})")
        if any(ms <= 0 for _, ms in self.latency_ms):
            raise TandemError(f"curve batch={self.batch} context={self.context}: latencies must be > 0")
        object.__setattr__(self, "_cost", CostModel(dict(self.latency_ms)))

    def cost_ms(self, n: float) -> float:
        """ms for n new tokens per sequence; n may be fractional (extrapolated by total tokens)."""
        lower = int(n)
        if lower == n:
            return self._cost.cost_ms(lower)
        fraction = n - lower
        return (1 - fraction) * self._cost.cost_ms(lower) + fraction * self._cost.cost_ms(lower + 1)


@dataclass(frozen=True, slots=True)
class MemoryUse:
    rss_delta_bytes: int  # process resident memory added by loading the model
    peak_rss_bytes: int | None = None  # process peak resident memory after measuring
    device_bytes: int | None = None  # accelerator memory at peak (torch cuda), None elsewhere


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    model: str
    backend: str
    device: str
    dtype: str
    threads: int | None
    source: str  # measured | public-spec
    curves: tuple[Curve, ...]
    measured_at: str | None = None  # ISO time of the measurement (measured profiles)
    citation: str | None = None  # public-spec: where the spec numbers come from
    hardware: str | None = None  # device class name ("h100-sxm")
    memory: MemoryUse | None = None
    peak_tflops: float | None = None  # public-spec: the peak the roofline used
    bandwidth_gbs: float | None = None  # public-spec: the bandwidth the roofline used
    prompt_ms: tuple[tuple[int, float], ...] = ()  # (n prompt tokens, ms), logits at the last only
    typical_over_fastest: float | None = None  # measured: median sample / fastest, the median over points

    def __post_init__(self):
        if self.typical_over_fastest is not None and not self.typical_over_fastest >= 1.0:
            raise TandemError(f"profile of {self.model}: typical_over_fastest must be >= 1 "
                              f"(got {self.typical_over_fastest})")
        if self.source not in SOURCES:
            raise TandemError(f"profile source must be one of {', '.join(SOURCES)} (got {self.source!r})")
        if self.source == "public-spec" and not self.citation:
            raise TandemError("a public-spec profile must cite where its numbers come from")
        if not self.curves:
            raise TandemError(f"profile of {self.model} on {self.device} has no curves")
        keys = [(c.batch, c.context) for c in self.curves]
        if len(set(keys)) != len(keys):
            raise TandemError(f"profile of {self.model} on {self.device}: a (batch, context) curve is repeated")
        contexts = {c.context for c in self.curves}
        for context in contexts:
            if 1 not in {c.batch for c in self.curves if c.context == context}:
                raise TandemError(f"profile of {self.model}: context {context} lacks a batch-1 curve")
        object.__setattr__(self, "curves", tuple(sorted(self.curves, key=lambda c: (c.context, c.batch))))

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(sorted({c.batch for c in self.curves}))

    @property
    def contexts(self) -> tuple[int, ...]:
        return tuple(sorted({c.context for c in self.curves}))

    def step_ms(self, batch: int, tokens_per_sequence: float, context: int) -> float:
        """One forward call: `batch` sequences, each scoring `tokens_per_sequence` new tokens."""
        if batch < 1 or tokens_per_sequence <= 0:
            return 0.0
        contexts = self.contexts
        if context <= contexts[0] or context >= contexts[-1]:
            return self._at_context(min(max(context, contexts[0]), contexts[-1]), batch, tokens_per_sequence)
        i = bisect.bisect_left(contexts, context)
        low, high = contexts[i - 1], contexts[i]
        fraction = (context - low) / (high - low)
        return ((1 - fraction) * self._at_context(low, batch, tokens_per_sequence)
                + fraction * self._at_context(high, batch, tokens_per_sequence))

    def _at_context(self, context: int, batch: int, n: float) -> float:
        curves = [c for c in self.curves if c.context == context]  # batch ascending
        batches = [c.batch for c in curves]
        if batch >= batches[-1]:
            return curves[-1].cost_ms(n * batch / batches[-1])
        i = bisect.bisect_left(batches, batch)
        if batches[i] == batch:
            return curves[i].cost_ms(n)
        low, high = curves[i - 1], curves[i]
        fraction = (batch - low.batch) / (high.batch - low.batch)
        return (1 - fraction) * low.cost_ms(n) + fraction * high.cost_ms(n)

    def sizes(self, batch: int = 1) -> tuple[int, ...]:
        """The measured n of the curves nearest this batch."""
        nearest = min(self.curves, key=lambda c: (abs(c.batch - batch), c.context))
        return tuple(n for n, _ in nearest.latency_ms)

    def prompt_cost(self, scale: float = 1.0) -> CostModel | None:
        """ms for one sequence to score n prompt tokens from an empty cache, times `scale`; None
        when the profile has no prompt curve."""
        return CostModel({n: ms * scale for n, ms in self.prompt_ms}) if self.prompt_ms else None



def profile_to_json(profile: DeviceProfile) -> dict:
    data = {"format": FORMAT}
    for name in DeviceProfile.__dataclass_fields__:
        if name not in ("curves", "memory", "prompt_ms"):
            data[name] = getattr(profile, name)
    if profile.prompt_ms:
        data["prompt_ms"] = {str(n): round(ms, 4) for n, ms in profile.prompt_ms}
    data["memory"] = None if profile.memory is None else {
        name: getattr(profile.memory, name) for name in MemoryUse.__dataclass_fields__}
    data["curves"] = [{"batch": c.batch, "context": c.context,
                       "latency_ms": {str(n): round(ms, 4) for n, ms in c.latency_ms}} for c in profile.curves]
    return data


def profile_from_json(data: dict) -> DeviceProfile:
    if data.get("format") != FORMAT:
        raise TandemError(f"unsupported profile format {data.get('format')!r} (expected {FORMAT})")
    curves = tuple(Curve(int(c["batch"]), int(c["context"]),
                         tuple(sorted((int(n), float(ms)) for n, ms in c["latency_ms"].items())))
                   for c in data["curves"])
    memory = MemoryUse(**data["memory"]) if data.get("memory") else None
    prompt = tuple(sorted((int(n), float(ms)) for n, ms in data.get("prompt_ms", {}).items()))
    plain = {k: data[k] for k in DeviceProfile.__dataclass_fields__
             if k in data and k not in ("curves", "memory", "prompt_ms")}
    return DeviceProfile(curves=curves, memory=memory, prompt_ms=prompt, **plain)


def save_profile(profile: DeviceProfile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(profile_to_json(profile), indent=1))
    return path


def load_profile(path: str | Path) -> DeviceProfile:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise TandemError(f"cannot read profile {path}: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:  # cut short, or edited
        raise TandemError(f"profile {path} is not valid JSON: {error} (`tandem profile --cluster FILE` "
                          "measures it again)") from None
    try:
        return profile_from_json(data)
    except (KeyError, TypeError, ValueError) as error:
        raise TandemError(f"profile {path} is malformed: {error!r}") from None
    except TandemError as error:
        raise TandemError(f"profile {path}: {error}") from None
