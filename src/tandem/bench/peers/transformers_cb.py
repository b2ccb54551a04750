"""transformers' own continuous batching as a peer of `tandem bench-serve`, run in-process.

transformers 5.x ships a continuous-batching engine: `model.init_continuous_batching(...)` returns a
`ContinuousBatchingManager` whose background thread keeps a paged KV cache and runs one forward per
step over every running request (prefill chunks and decodes mixed, FIFO). This peer drives it the
way bench-serve's clients drive a server: at concurrency C it keeps C requests in flight
(`add_request` C times, then one more each time `get_result` hands back a finished one) until the
level's requests are done. Levels, requests and figures are bench-serve's (the same interleaved
workload and repeat marks, `summarize`, the results.json shape), so its levels sit beside
bench-serve's; each request entry also keeps its `output_ids`.

Timed per request: from just before the chat template and tokenizer run (as a server would) to when
the finished output reaches the client loop. Token times are the manager's own per-token
timestamps (`record_timestamps=True`), taken in its thread as each token is sampled, so TTFT and ITL
carry no HTTP, SSE or detokenization cost: an in-process upper bound for a transformers server.
Outputs stop at the tokenizer's stop ids, which are neither kept nor counted (as in Tandem's usage).

Choices: Tandem's torch model folder (`hf_path`) and dtype; greedy (`do_sample=False`, no logits
processors); `sdpa` attention unless told otherwise (the manager keeps sdpa or paged|eager, and
switches to flash attention where it is installed); the KV cache sized for the workload (`num_blocks`
= pages for the largest C requests at the longest prompt plus max tokens; left to itself on CPU the
manager claims 60% of RAM); everything else transformers' defaults, prefix block sharing included
(Tandem reuses prompt prefixes too).
"""

import json
import shlex
import sys
import time
from dataclasses import dataclass, replace
from math import ceil
from pathlib import Path
from typing import Callable, Sequence

from tandem.progress import ProgressBar
from tandem.token_ids import cut_at_stop
from tandem.bench.machine import machine_info
from tandem.bench.serve.client import RequestRecord, build_record, failed
from tandem.bench.serve.loadgen import LoadResult
from tandem.bench.serve.metrics import summarize
from tandem.bench.serve.report import level_table, throughput_table
from tandem.bench.serve.requests import BenchRequest, level_requests, warmup_request
from tandem.bench.serve.results import request_entry
from tandem.bench.serve.settings import check_num_prompts, requests_per_level
from tandem.bench.out_dir import prepare_out_dir
from tandem.bench.workload import load_prompts, recorded_prompts_file
from tandem.errors import InterruptSaid, TandemError
from tandem.models.backends import RunnerSpec
from tandem.models.resolve import hf_path, tokenizer_path
from tandem.models.torch_runner import DTYPES, torch_device, torch_dtype
from tandem.text.tokenizer import TextTokenizer

LABEL = "transformers-cb"
POLL_S = 0.05  # how long one `get_result` waits before the loop checks the manager is alive
STALL_TIMEOUT_S = 600.0  # no request finishing for this long fails the run
DEFAULT_PAGE_SIZE = 256  # transformers' default: tokens per KV page
CONFIG_FIELDS = ("page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch", "allow_block_sharing",
                 "use_cuda_graph", "use_async_batching")
NOTES = ("transformers' ContinuousBatchingManager in-process (no HTTP): a closed loop of add_request/get_result, "
         "greedy; TTFT/ITL from the manager's per-token timestamps")


@dataclass(frozen=True, slots=True)
class CbPeerSettings:
    model: str  # catalog name, .gguf file or HF folder
    concurrency: tuple[int, ...]
    prompts_file: Path
    out_dir: Path
    dtype: str = "fp32"
    device: str = "auto"  # as Tandem's torch backend: a GPU where one exists, else cpu
    num_prompts: int | None = None  # requests per level; None = bench-serve's default formula
    max_tokens: int = 50
    threads: int | None = None  # torch CPU threads; None = torch's default
    attn_implementation: str = "sdpa"
    max_batch_tokens: int | None = None  # tokens per forward; None = transformers' default
    page_size: int = DEFAULT_PAGE_SIZE
    command: str = "tandem bench-peer transformers-cb"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise TandemError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise TandemError(f"concurrency levels must be positive, got {self.concurrency}")
        for name, value in (("--max-tokens", self.max_tokens), ("--threads", self.threads),
                            ("--max-batch-tokens", self.max_batch_tokens), ("--page-size", self.page_size)):
            if value is not None and value < 1:
                raise TandemError(f"{name} must be a positive integer, got {value}")
        check_num_prompts(self.num_prompts, self.concurrency)

    def requests_at(self, concurrency: int) -> int:
        return requests_per_level(self.num_prompts, concurrency)


@dataclass(frozen=True, slots=True)
class LevelRun:
    result: LoadResult
    output_ids: tuple[tuple[int, ...], ...]  # per request, in request-list order, stop ids cut


def load_model(model: str, device: str, dtype: str, attn_implementation: str):
    """The transformers model of Tandem's torch backend: the same HF folder, device and dtype."""
    from transformers import AutoModelForCausalLM

    folder = hf_path(model)
    target_device = torch_device(device)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype(dtype),
                                                      attn_implementation=attn_implementation)
        return loaded.to(target_device).eval()
    except (OSError, ValueError, RuntimeError, ImportError, AssertionError) as error:  # no CUDA: AssertionError
        raise TandemError(f"cannot load {folder} on {device} ({dtype}, {attn_implementation}): {error}") from None


def output_record(request: BenchRequest, output, sent: float, end: float, stop_ids: frozenset[int],
                  max_tokens: int, prompt_tokens: int | None = None,
                  decode: Callable[[list[int]], str] | None = None) -> tuple[RequestRecord, tuple[int, ...]]:
    """A bench-serve record from a finished `GenerationOutput`; token times are its timestamps.
    With `decode`, the record keeps the answer's text, as a server's does (bench-ceiling reads it)."""
    if output.error is not None:
        return failed(request.prompt_id, request.category, str(output.error), sent), ()
    kept = cut_at_stop(output.generated_tokens, stop_ids, max_tokens)
    token_times = list(output.timestamps or [])[: len(kept)]
    finish_reason = "length" if len(kept) == max_tokens else "stop"
    record = build_record(request.prompt_id, request.category, sent, end, token_times,
                          {"completion_tokens": len(kept), "prompt_tokens": prompt_tokens}, finish_reason,
                          decode(list(kept)) if decode is not None else "")
    return record, tuple(kept)


class TransformersCbPeer:
    """One model and one manager for the whole sweep, started once (like a server) and stopped at the end."""

    def __init__(self, settings: CbPeerSettings):
        import torch

        if settings.threads:
            torch.set_num_threads(settings.threads)  # the manager's thread inherits it
        self.settings = settings
        self.device = RunnerSpec(settings.model, "torch", settings.device, settings.dtype).resolved().device
        self.tokenizer = TextTokenizer(str(tokenizer_path(settings.model)))
        self.stop_ids = self.tokenizer.stop_token_ids
        self.model = load_model(settings.model, self.device, settings.dtype, settings.attn_implementation)
        self.manager = None
        self._sent = 0

    def start(self, max_running: int, longest_prompt: int) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        s = self.settings
        cache_tokens = max_running * (longest_prompt + s.max_tokens)
        num_blocks = ceil(cache_tokens / s.page_size) + max_running  # each request's last page may be part-filled
        config = ContinuousBatchingConfig(page_size=s.page_size, num_blocks=num_blocks,
                                          max_batch_tokens=s.max_batch_tokens)
        stops = sorted(self.stop_ids)
        generation = GenerationConfig(do_sample=False, max_new_tokens=s.max_tokens, eos_token_id=stops,
                                      pad_token_id=stops[0])
        self.manager = self.model.init_continuous_batching(generation_config=generation,
                                                           continuous_batching_config=config)
        self.manager.warmup()  # captures CUDA graphs where it uses them; a no-op on CPU
        self.manager.start()

    def stop(self) -> None:
        if self.manager is not None:
            self.manager.stop(block=True)
            self.manager.destroy()
            self.manager = None

    def info(self) -> dict:
        resolved = self.manager.continuous_batching_config
        return {"command": shlex.split(self.settings.command), "notes": NOTES, "base_url": None,
                "model": self.settings.model, "attn_implementation": self.model.config._attn_implementation,
                "cb_config": {name: _plain(getattr(resolved, name)) for name in CONFIG_FIELDS}}

    def run_level(self, requests: Sequence[BenchRequest], concurrency: int,
                  on_done: Callable[[RequestRecord], None] | None = None) -> LevelRun:
        """A closed loop: `concurrency` requests in flight, a new one sent as each finishes."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        pending = iter(enumerate(requests))
        in_flight: dict[str, tuple[int, float, int]] = {}  # request id -> (index in requests, send time, prompt tokens)
        records: list[RequestRecord | None] = [None] * len(requests)
        outputs: list[tuple[int, ...]] = [()] * len(requests)
        start = time.perf_counter()
        for _ in range(concurrency):
            self._send_next(pending, in_flight)
        peak = len(in_flight)
        while in_flight:
            output = self._next_finished()
            index, sent, prompt_tokens = in_flight.pop(output.request_id)
            record, outputs[index] = output_record(requests[index], output, sent, time.perf_counter(), self.stop_ids,
                                                   self.settings.max_tokens, prompt_tokens, self.tokenizer.decode)
            records[index] = replace(record, sent_s=sent - start)
            if on_done is not None:
                on_done(records[index])
            self._send_next(pending, in_flight)
        wall = time.perf_counter() - start
        return LevelRun(LoadResult(concurrency, tuple(records), wall, peak), tuple(outputs))

    def _send_next(self, pending, in_flight: dict[str, tuple[int, float, int]]) -> None:
        item = next(pending, None)
        if item is None:
            return
        index, request = item
        sent = time.perf_counter()
        prompt_ids = self.tokenizer.chat_prompt_ids([dict(m) for m in request.messages])
        request_id = f"req-{self._sent}"
        self._sent += 1
        if self.manager.add_request(prompt_ids, request_id=request_id, max_new_tokens=self.settings.max_tokens,
                                    record_timestamps=True, eos_token_id=sorted(self.stop_ids)) is None:
            raise TandemError(f"{LABEL}: the manager refused request {request.prompt_id} (is it stopping?)")
        in_flight[request_id] = (index, sent, len(prompt_ids))

    def _next_finished(self):
        deadline = time.perf_counter() + STALL_TIMEOUT_S
        while time.perf_counter() < deadline:
            output = self.manager.get_result(timeout=POLL_S)
            if output is not None and output.is_finished():
                return output
            if output is None and not self.manager.is_running():
                error = self.manager.background_thread_status.fatal_error
                raise TandemError(f"{LABEL}: the generation thread stopped: {error}")
        raise TandemError(f"{LABEL}: no request finished in {STALL_TIMEOUT_S:.0f} s")


def plan_levels(settings: CbPeerSettings, prompts: list) -> list[tuple[int, list[BenchRequest]]]:
    """bench-serve's plan: each level takes the next requests of the interleaved workload."""
    plans, offset = [], 0
    for concurrency in settings.concurrency:
        count = settings.requests_at(concurrency)
        plans.append((concurrency, level_requests(prompts, count, offset)))
        offset += count
    return plans


def run_peer_sweep(settings: CbPeerSettings, progress: bool = True) -> dict:
    """Load, warm up, run every level in ascending concurrency, write results.json and report.md."""
    plans = plan_levels(settings, load_prompts(settings.prompts_file))
    prepare_out_dir(settings.out_dir)
    print(f"loading {settings.model} ({settings.dtype}) for {LABEL}...", file=sys.stderr)
    peer = TransformersCbPeer(settings)
    every_request = [r for _, requests in plans for r in requests] + [warmup_request()]
    longest = max(len(peer.tokenizer.chat_prompt_ids(list(r.messages))) for r in every_request)
    runs = {}
    try:
        peer.start(max(settings.concurrency), longest)
        peer.run_level([warmup_request()], 1)  # untimed, as bench-serve warms every server up
        for concurrency, requests in plans:
            with ProgressBar(total=len(requests), desc=f"C={concurrency} {LABEL}", unit="req", file=sys.stderr,
                      disable=not progress, leave=False) as bar:
                runs[concurrency] = peer.run_level(requests, concurrency, on_done=lambda _record: bar.update())
            print(f"C={concurrency} {LABEL}: {len(requests)} requests in {runs[concurrency].result.wall_s:.1f} s",
                  file=sys.stderr)
        info = peer.info()  # read while the manager runs
    except KeyboardInterrupt:  # Ctrl-C: the levels finished so far are kept, then the interrupt goes on
        if runs:
            write_outputs(build_results(settings, peer.device, peer.info(), runs) | {"interrupted": True},
                          settings.out_dir)
            print(f"\ninterrupted: wrote the finished levels (C={', '.join(map(str, sorted(runs)))}) "
                  f"to {settings.out_dir}", file=sys.stderr)
            raise InterruptSaid() from None
        raise
    finally:
        peer.stop()
    results = build_results(settings, peer.device, info, runs)
    write_outputs(results, settings.out_dir)
    return results


def build_results(settings: CbPeerSettings, device: str, info: dict, runs: dict[int, LevelRun]) -> dict:
    """bench-serve's results.json shape, with one config; request entries add `output_ids`."""
    header = {"command": settings.command, "settings": {
        "target": settings.model, "hf_folder": str(hf_path(settings.model)), "device": device,
        "dtype": settings.dtype, "threads": settings.threads, "concurrency": list(settings.concurrency),
        "prompts_file": recorded_prompts_file(settings.prompts_file), "max_tokens": settings.max_tokens,
        "requests_per_level": {str(c): len(run.result.records) for c, run in runs.items()},
    }, "machine": machine_info()}
    levels = []
    for concurrency, run in sorted(runs.items()):
        entries = [{**request_entry(r), "output_ids": list(ids)} for r, ids in zip(run.result.records, run.output_ids)]
        levels.append({"concurrency": concurrency, "order": [LABEL], "ratios": [],
                       "configs": {LABEL: {**summarize(run.result), "request_records": entries}}})
    return {**header, "configs": [LABEL], "servers": {LABEL: info}, "levels": levels}


def render_report(results: dict) -> str:
    s, info = results["settings"], results["servers"][LABEL]
    lines = [f"# {LABEL} serving peer", "", f"`{results['command']}`", ""]
    if results.get("interrupted"):
        lines += ["**Interrupted**: only the levels finished are here.", ""]
    lines += [f"Model `{s['target']}` ({s['hf_folder']}) on {s['device']} in {s['dtype']}, threads {s['threads']}, "
              f"attention {info['attn_implementation']}; up to {s['max_tokens']} greedy tokens per request.", "",
              f"{NOTES}. Cache: {json.dumps(info['cb_config'])}.", "", "## Throughput (completion tokens/s)", ""]
    lines += throughput_table(results)
    for level in results["levels"]:
        lines += ["", f"## Concurrency {level['concurrency']}", ""] + level_table(results, level)
    lines += ["", "## Machine", ""] + [f"- {key}: {value}" for key, value in results["machine"].items()]
    return "\n".join(lines) + "\n"


def write_outputs(results: dict, out_dir: Path) -> None:
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    (out_dir / "report.md").write_text(render_report(results))


def _plain(value):
    """A config value as JSON holds it, so results in memory equal results.json."""
    return list(value) if isinstance(value, tuple) else value
