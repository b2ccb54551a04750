"""The torch path on a CUDA GPU, checked and timed in one run (a lent GPU gives minutes, not hours).

Nothing can be downloaded on the GPU machine, so the models are Qwen2.5-Coder's 1.5B target and
0.5B draft shapes (their config.json figures, below) with random weights: right for timings and
for exactness, meaningless for acceptance (take that from CPU runs on the real weights).

1. ceilings: a device copy's bandwidth and a large bf16 matrix product's rate;
2. reference: the fused runner's greedy tokens against transformers' own `generate`, fp32;
3. lossless: the engine's greedy output with drafts (the draft model; the target's own weights
   as the draft, so rounds accept long runs; n-gram copies) against plain decoding, fp32 and bf16;
   in fp32 also plain decoding one request at a time against plain at C=8 (other shapes);
4. exact sampling on the device: the device acceptance rules' first tokens (speculative and
   positional), chi-square against p;
5. step costs: the fused runner, B sequences x T tokens at 512 cached tokens, bf16;
6. throughput: the engine (plain decoding) against transformers' continuous batching
   (`generate_batch`), the same random prompts and weights, bf16.
7. spec (only when asked, `--only spec`): n-gram drafting's decode steps against plain decoding's,
   fp32, C=1 and C=8, and a cProfile of the n-gram run.
8. device_profile (only when asked): `tandem profile`'s grid on the fused runner, bf16, batches up
   to 64, written as a cluster profile (`profiles:` in a cluster file) for `tandem simulate`.

    python3 scripts/gpu_check.py --out $OUT          # on the GPU machine, ~5 min
    .venv/bin/python scripts/gpu_check.py --small    # a dry run on the CPU, tiny shapes
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

QWEN_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=6000, tie_word_embeddings=True)
COMMON = dict(model_type="qwen2", rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
              use_sliding_window=False)


def log(*parts) -> None:
    print(*parts, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_hf_model(shape: dict, dtype: torch.dtype, device: torch.device, seed: int):
    """A transformers Qwen2 model of `shape` with random weights, made on the device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**{**COMMON, **shape})
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    return model.eval()


def fused_runner(hf_model, dtype: torch.dtype, device: torch.device, slots: int, name: str, context: int = 2048):
    """Tandem's fused runner over the same weights, with its cost curve measured."""
    from tandem.models.batch_backends import BATCH_PROFILE_SIZES
    from tandem.models.batch_runner import SlotView
    from tandem.models.cost import measure_cost
    from tandem.models.paged.decoder import DecoderConfig, PagedDecoder
    from tandem.models.paged.fused_runner import FusedTorchRunner

    raw = {**COMMON, **{k: v for k, v in hf_model.config.to_dict().items() if k in QWEN_15B}}
    decoder = PagedDecoder(DecoderConfig.from_dict(raw), dict(hf_model.state_dict()), dtype, device)
    runner = FusedTorchRunner(decoder, slots, context, kv_memory=8 * 2**30 if device.type == "cuda" else 2**28,
                              name=name, cache_slots=slots)
    view = SlotView(runner)
    view.forward([1] * 64, num_logits=0)
    runner.cost = measure_cost(view.forward, view.rollback, 64, BATCH_PROFILE_SIZES, repeats=3)
    runner.rollback(0, 0)
    return runner


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    """Random tokens with a repeated stretch in each, so that copies have something to find."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        body = rng.integers(100, vocab - 100, size=length // 2).tolist()
        prompts.append(tuple(body + body[: length - len(body)]))
    return prompts


def run_engine(engine, prompts, max_tokens: int, concurrency: int, sampling=None) -> tuple[list[list[int]], dict]:
    """Closed loop of `concurrency` sequences; every request's tokens and the run's figures."""
    from tandem.engine.request import GenerationRequest
    from tandem.speculation.sampling import SamplingParams

    sampling = sampling or SamplingParams()
    outputs = {i: [] for i in range(len(prompts))}
    pending, running = list(range(len(prompts))), set()
    drafted = accepted = steps = 0
    start = time.perf_counter()
    while pending or running:
        while pending and len(running) < concurrency:
            index = pending.pop(0)
            engine.add(f"r-{index}", GenerationRequest(prompts[index], max_tokens=max_tokens, sampling=sampling))
            running.add(index)
        updates, _ = engine.step()
        steps += 1
        for update in updates:
            index = int(update.seq_id.split("-")[1])
            outputs[index].extend(update.token_ids)
            drafted += update.drafted
            accepted += update.accepted
            if update.finished:
                running.discard(index)
    seconds = time.perf_counter() - start
    tokens = sum(len(o) for o in outputs.values())
    return [outputs[i] for i in range(len(prompts))], dict(
        seconds=seconds, tokens=tokens, tok_s=tokens / seconds, steps=steps,
        acceptance=accepted / drafted if drafted else None)


def make_engine(target, draft, drafter: str, max_running: int, depth="auto"):
    from tandem.engine.batch_engine import BatchEngine

    return BatchEngine(target, draft, drafter, depth, max_running=max_running)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    from tandem.token_ids import common_prefix

    same = common_prefix(a, b)
    return None if same == len(a) == len(b) else same


def check_ceilings(device: torch.device, small: bool) -> dict:
    from tandem.bench.step import memory_bandwidth

    size = 512 if small else 8192
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    tflops = 10 * 2 * size**3 / (time.perf_counter() - start) / 1e12
    bandwidth = memory_bandwidth(device)
    log(f"[ceilings] copy {bandwidth / 1e12:.2f} TB/s (read + write); bf16 {size}^3 matmul {tflops:.0f} TFLOP/s")
    return dict(bandwidth_tb_s=bandwidth / 1e12, bf16_tflops=tflops)


def check_reference(device: torch.device, shape: dict, small: bool) -> dict:
    """The fused runner's greedy continuation against transformers' generate, fp32, one prompt."""
    from tandem.engine.batch_engine import BatchEngine

    model = build_hf_model(shape, torch.float32, device, seed=1)
    runner = fused_runner(model, torch.float32, device, 1, "ref")
    prompt = random_prompts(1, 64 if small else 200, shape["vocab_size"], seed=5)[0]
    tokens = 48
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        hf = model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                            min_new_tokens=tokens)[0, len(prompt):].tolist()
    ours, _ = run_engine(BatchEngine(runner, None, "none", 0, max_running=1), [prompt], tokens, 1)
    where = first_divergence(hf, ours[0])
    log(f"[reference] fused runner vs transformers generate, fp32, {tokens} tokens: "
        + ("identical" if where is None else f"first differs at token {where}"))
    del model, runner
    return dict(identical=where is None, first_divergence=where)


def check_lossless(device: torch.device, shape: dict, dtype: torch.dtype, small: bool) -> dict:
    """Greedy output with each drafter against plain decoding, same engine, C=8, 16 requests."""
    name = str(dtype).removeprefix("torch.")
    target_model = build_hf_model(shape, dtype, device, seed=2)
    target = fused_runner(target_model, dtype, device, 8, f"target-{name}")
    self_draft = fused_runner(target_model, dtype, device, 8, f"self-draft-{name}")
    prompts = random_prompts(16, 64 if small else 256, shape["vocab_size"], seed=7)
    tokens = 32 if small else 96
    plain, plain_run = run_engine(make_engine(target, None, "none", 8), prompts, tokens, 8)
    result = {"plain_tok_s": plain_run["tok_s"]}
    if dtype == torch.float32:
        # The target alone, one request at a time: other matrix shapes, so other rounding. Where a
        # drafter's output parts from plain C=8 at a near-tie, this says whether plain itself does.
        alone, _ = run_engine(make_engine(target, None, "none", 1), prompts, tokens, 1)
        firsts = [first_divergence(a, b) for a, b in zip(plain, alone)]
        result["plain_alone"] = dict(identical=sum(f is None for f in firsts), of=len(prompts),
                                     first_divergences=[f for f in firsts if f is not None])
        log(f"[lossless {name}] plain C=1 vs plain C=8: {result['plain_alone']['identical']}/{len(prompts)} "
            f"requests identical (first divergences {result['plain_alone']['first_divergences']})")
    for drafter, draft in (("model", self_draft), ("ngram", None)):
        depth = 4 if drafter == "model" else "auto"  # the self-draft costs what the target does: auto would not draft
        outputs, run = run_engine(make_engine(target, draft, drafter, 8, depth), prompts, tokens, 8)
        same = sum(a == b for a, b in zip(plain, outputs))
        firsts = [first_divergence(a, b) for a, b in zip(plain, outputs)]
        result[drafter] = dict(identical=same, of=len(prompts), acceptance=run["acceptance"],
                               first_divergences=[f for f in firsts if f is not None], tok_s=run["tok_s"])
        if dtype == torch.float32:
            result[drafter]["gaps"] = [_tie_gap(target_model, prompts[i], plain[i], outputs[i], f)
                                       for i, f in enumerate(firsts) if f is not None]
        log(f"[lossless {name}] {drafter:5s} drafts vs plain: {same}/{len(prompts)} requests identical "
            f"(acceptance {run['acceptance'] or 0:.2f}, first divergences {[f for f in firsts if f is not None]})")
    del target_model, target, self_draft
    return result


def _tie_gap(model, prompt, plain: list[int], other: list[int], where: int) -> dict:
    """At a divergence: the two tokens' logits in a third, separate computation (transformers,
    one sequence alone), and the gap between them against the top logit's size."""
    with torch.no_grad():
        ids = torch.tensor([list(prompt) + plain[:where]], device=model.device)
        logits = model(ids).logits[0, -1].float()  # [vocab]
    a, b = float(logits[plain[where]]), float(logits[other[where]])
    top = torch.topk(logits, 2).values.tolist()
    gap = dict(at=where, plain_logit=a, other_logit=b, gap=abs(a - b), top2_gap=top[0] - top[1],
               relative=abs(a - b) / max(abs(top[0]), 1e-9))
    log(f"  divergence at {where}: plain's token {a:.6f}, the other's {b:.6f} (gap {abs(a - b):.2e},"
        f" {gap['relative']:.1e} of the top logit)")
    return gap


def check_spec(device: torch.device, shape: dict, small: bool) -> dict:
    """Where n-gram speculation's step time goes against plain decoding's, fp32, the lossless
    check's random model and prompts: tok/s, decode steps' wall, verify and model time, and
    tokens per round, at C=1 and C=8, then a cProfile of the n-gram C=8 run."""
    import cProfile
    import io
    import pstats

    from tandem.engine.request import GenerationRequest

    model = build_hf_model(shape, torch.float32, device, seed=2)
    runner = fused_runner(model, torch.float32, device, 8, "target-float32")
    prompts = random_prompts(16, 64 if small else 256, shape["vocab_size"], seed=7)
    tokens = 32 if small else 96
    result = {}
    run_engine(make_engine(runner, None, "ngram", 8), prompts[:8], 8, 8)  # warm-up
    for concurrency in (1, 8):
        for drafter in ("none", "ngram"):
            engine = make_engine(runner, None, drafter, concurrency)
            chosen = prompts[:concurrency]
            for i, prompt in enumerate(chosen):
                engine.add(f"s-{i}", GenerationRequest(prompt, max_tokens=tokens))
            rows, made, start = [], 0, time.perf_counter()
            while engine.has_work:
                updates, report = engine.step()
                made += sum(len(u.token_ids) for u in updates)
                if not report.prefill_tokens and report.rounds:
                    rows.append((report.step_seconds, report.verify_seconds, report.draft_seconds,
                                 runner.last_model_ms / 1000, report.batch_tokens, len(report.rounds),
                                 sum(r.accepted for r in report.rounds), sum(r.k for r in report.rounds)))
            seconds = time.perf_counter() - start
            n = max(len(rows), 1)
            mean = [sum(r[i] for r in rows) / n for i in range(8)]
            figures = dict(tok_s=made / seconds, decode_steps=len(rows), step_ms=1000 * mean[0],
                           verify_ms=1000 * mean[1], draft_ms=1000 * mean[2], model_ms=1000 * mean[3],
                           batch_tokens=mean[4], rounds=mean[5],
                           tokens_per_round=(mean[6] + mean[5]) / max(mean[5], 1e-9),
                           acceptance=mean[6] / mean[7] if mean[7] else None)
            result[f"c{concurrency}-{drafter}"] = figures
            log(f"[spec] C={concurrency} {drafter:5s}: {figures['tok_s']:7.1f} tok/s; decode steps {len(rows)}:"
                f" wall {figures['step_ms']:.1f} ms, verify {figures['verify_ms']:.1f}, model {figures['model_ms']:.1f},"
                f" draft {figures['draft_ms']:.1f}; {figures['batch_tokens']:.1f} tokens scored,"
                f" {figures['tokens_per_round']:.2f} tokens a round")
    profile = cProfile.Profile()
    profile.enable()
    _, run = run_engine(make_engine(runner, None, "ngram", 8), prompts, tokens, 8)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    log(f"[spec] profiled ngram C=8, 16 x {tokens}: {run['tok_s']:.1f} tok/s, {run['steps']} steps")
    log("\n".join(text.getvalue().splitlines()[:50]))
    result["profile"] = text.getvalue()[:8000]
    del model, runner
    return result


def check_profile(runner, shape: dict) -> dict:
    """Where an engine step's time goes beyond the runner's forward: cProfile of a C=16 run."""
    import cProfile
    import io
    import pstats

    from tandem.bench.step import fill_slots, time_step

    wide = min(16, runner.max_slots)
    for context in (256, 300, 301, 512):
        fill_slots(runner, wide, context)
        t = time_step(runner, "fused", wide, 1, 5)
        log(f"[profile] bench step B={wide} x 1 at context {context}: {t.step_ms:.1f} ms (model {t.model_ms:.1f})")
    for slot in range(wide):
        runner.rollback(slot, 0)
    for concurrency in (1, wide):
        engine = make_engine(runner, None, "none", concurrency)
        prompts = random_prompts(concurrency, 256, shape["vocab_size"], seed=9)
        from tandem.engine.request import GenerationRequest
        for i, prompt in enumerate(prompts):
            engine.add(f"p-{i}", GenerationRequest(prompt, max_tokens=64))
        rows = []
        while engine.has_work:
            start = time.perf_counter()
            _, report = engine.step()
            rows.append((time.perf_counter() - start, report.verify_seconds, report.prefill_tokens,
                         runner.last_model_ms / 1000))
        for label, chosen in (("prefill", [r for r in rows if r[2]]), ("decode", [r for r in rows if not r[2]])):
            if chosen:
                n = len(chosen)
                log(f"[profile] engine C={concurrency} {label} steps {n}: wall {1000 * sum(r[0] for r in chosen) / n:.1f} ms,"
                    f" verify {1000 * sum(r[1] for r in chosen) / n:.1f} ms, model {1000 * sum(r[3] for r in chosen) / n:.1f} ms")
    prompts = random_prompts(16, 256, shape["vocab_size"], seed=9)
    _, warm = run_engine(make_engine(runner, None, "none", 16), prompts, 8, 16)
    profile = cProfile.Profile()
    profile.enable()
    _, run = run_engine(make_engine(runner, None, "none", 16), prompts, 64, 16)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    log(f"[profile] C=16 x 64 tokens: {run['tok_s']:.1f} tok/s, {run['steps']} steps, "
        f"{1000 * run['seconds'] / run['steps']:.1f} ms a step")
    log("\n".join(text.getvalue().splitlines()[:45]))
    return dict(run=run, top=text.getvalue()[:6000])


def check_sdpa(runner, shape: dict) -> dict:
    """Engine decode at C=1 and C=16 (fresh context lengths each step, as in serving) under each
    of torch's attention back ends, each run twice (the second over lengths already seen)."""
    from tandem.engine.request import GenerationRequest

    choices = {"default": {}, "no-cudnn": dict(enable_cudnn=False),
               "efficient-only": dict(enable_cudnn=False, enable_flash=False, enable_math=False),
               "math-only": dict(enable_cudnn=False, enable_flash=False, enable_mem_efficient=False)}
    result = {}
    for label, flags in choices.items():
        for concurrency in (1, 16):
            for attempt in (1, 2):
                engine = make_engine(runner, None, "none", concurrency)
                prompts = random_prompts(concurrency, 256, shape["vocab_size"], seed=21 + concurrency)
                for i, prompt in enumerate(prompts):
                    engine.add(f"s-{i}", GenerationRequest(prompt, max_tokens=48))
                decode = []
                try:
                    with torch.nn.attention.sdpa_kernel(_backends(flags)):
                        while engine.has_work:
                            start = time.perf_counter()
                            _, report = engine.step()
                            if not report.prefill_tokens:
                                decode.append(time.perf_counter() - start)
                    ms = 1000 * sum(decode) / len(decode)
                except Exception as error:
                    ms = float("nan")
                    log(f"[sdpa] {label}: {type(error).__name__}: {str(error)[:200]}")
                    while engine.has_work:
                        engine.step()
                result[f"{label} C={concurrency} #{attempt}"] = ms
                log(f"[sdpa] {label:14s} C={concurrency:2d} pass {attempt}: decode step {ms:6.1f} ms")
    return result


def _backends(flags: dict) -> list:
    from torch.nn.attention import SDPBackend

    chosen = [SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        chosen.append(SDPBackend.CUDNN_ATTENTION)
    names = {"enable_math": SDPBackend.MATH, "enable_mem_efficient": SDPBackend.EFFICIENT_ATTENTION,
             "enable_flash": SDPBackend.FLASH_ATTENTION, "enable_cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}
    return [b for b in chosen if all(not (names[k] == b and v is False) for k, v in flags.items())]


def check_sampling(device: torch.device, draws: int) -> dict:
    """First emitted token of a k=1 round under the device rules, chi-square against p_target:
    exact speculative sampling (an unseeded request) and the positional rule (a seeded one, a
    fresh seed each round)."""
    from tandem.speculation.acceptance import accept_round
    from tandem.speculation.sampling import SamplingParams

    p = np.array([0.35, 0.25, 0.20, 0.12, 0.08, 0.00])
    q = np.array([0.10, 0.40, 0.30, 0.00, 0.05, 0.15])
    with np.errstate(divide="ignore"):
        logits = torch.tensor(np.log(np.stack([p, p])), dtype=torch.float32, device=device)  # [2, vocab]
    critical = 18.467  # chi-square, 4 degrees of freedom, upper 0.001
    support = p > 0
    results = {}
    for rule in ("speculative", "positional"):
        rng = np.random.default_rng(11)
        counts = np.zeros(6)
        for round_index in range(draws):
            sampling = SamplingParams(temperature=1.0, seed=round_index if rule == "positional" else None)
            draft = int(rng.choice(6, p=q))
            result = accept_round([draft], q[None, :], logits, sampling, rng, position=0)
            first = draft if result.accepted >= 1 else result.next_token
            counts[first] += 1
        expected = p[support] * draws
        statistic = (float(((counts[support] - expected) ** 2 / expected).sum())
                     if not counts[~support].any() else float("inf"))
        log(f"[sampling] {rule} rule on {device}, {draws} rounds: chi-square {statistic:.1f} "
            f"(critical {critical}), counts {counts.astype(int).tolist()}")
        results[rule] = dict(chi_square=statistic, critical=critical, passed=statistic < critical,
                             counts=counts.tolist())
    return results


def check_device_profile(device: torch.device, shape: dict, small: bool, out: str | None) -> dict:
    """A cluster profile of the fused runner on this device (`tandem profile`'s grid and format,
    batches up to 64), for `tandem simulate` and `tandem plan`: the 1.5B target's shape, bf16."""
    from tandem.cluster.profiles.measure import ProfileGrid, context_needed, profile_runner
    from tandem.cluster.profiles.profile import save_profile
    from tandem.models.backends import RunnerSpec

    grid = (ProfileGrid(sizes=(1, 4, 16), contexts=(64, 256), batches=(1, 2, 4), repeats=2) if small
            else ProfileGrid(batches=(1, 2, 4, 8, 16, 32, 64)))
    needed = context_needed(grid)
    model = build_hf_model(shape, torch.bfloat16, device, seed=3)
    runner = fused_runner(model, torch.bfloat16, device, grid.batches[-1], "profile-bf16", context=needed)
    spec = RunnerSpec("qwen2.5-coder-1.5b-instruct", "torch", device.type, "bf16")
    start = time.perf_counter()
    profile = profile_runner(runner, spec, grid, progress=False)
    seconds = time.perf_counter() - start
    name = f"profile-{device.type}-qwen2.5-coder-1.5b-bf16.json"
    if out:
        save_profile(profile, Path(out) / name)
    at = 512 if 512 in grid.contexts else grid.contexts[-1]
    one = {n: round(profile.step_ms(1, n, at), 1) for n in grid.sizes}
    widest = {n: round(profile.step_ms(grid.batches[-1], n, at), 1) for n in grid.sizes}
    log(f"[device_profile] {grid.points} points x {grid.repeats} in {seconds:.0f} s, typical/fastest "
        f"{profile.typical_over_fastest}; at {at} cached tokens, ms by tokens per sequence: B=1 {one}, "
        f"B={grid.batches[-1]} {widest}" + (f"; wrote {name}" if out else ""))
    del model, runner
    return dict(file=name, seconds=seconds, typical_over_fastest=profile.typical_over_fastest, b1_ms=one,
                widest_ms=widest)


def check_steps(runner, batches, tokens) -> list[dict]:
    from tandem.bench.step import fill_slots, time_step

    rows = []
    for batch in batches:
        fill_slots(runner, batch, 512)
        for count in tokens:
            t = time_step(runner, "fused", batch, count, 5)
            rows.append(dict(batch=batch, tokens=count, step_ms=t.step_ms, model_ms=t.model_ms))
    log("[steps] fused runner, bf16, 512 cached tokens: step ms (model ms) by batch x tokens per slot")
    log("  B   " + "".join(f"{t:>14d}" for t in tokens))
    for batch in batches:
        cells = [r for r in rows if r["batch"] == batch]
        log(f"  {batch:<4d}" + "".join(f"{r['step_ms']:8.1f} ({r['model_ms']:4.1f})" for r in cells))
    return rows


def check_throughput(model, runner, shape: dict, counts, prompt_tokens: int, max_tokens: int) -> list[dict]:
    """Offline: N random prompts at once, plain greedy decoding, Tandem's engine vs transformers CB."""
    from transformers import GenerationConfig

    rows = []
    for count in counts:
        prompts = random_prompts(count, prompt_tokens, shape["vocab_size"], seed=100 + count)
        _, ours = run_engine(make_engine(runner, None, "none", count), prompts, max_tokens, count)
        row = dict(requests=count, tandem_tok_s=ours["tok_s"], tandem_steps=ours["steps"])
        try:
            config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
            seconds, tokens = _continuous_batching(model, config, prompts, max_tokens)
            row.update(cb_tok_s=tokens / seconds, cb_tokens=tokens)
        except Exception as error:  # the peer's API moves between versions; report, go on
            row.update(cb_error=f"{type(error).__name__}: {error}"[:300])
        log(f"[throughput] {count:3d} requests x {max_tokens} tokens: tandem {row['tandem_tok_s']:8.1f} tok/s"
            + (f", transformers CB {row['cb_tok_s']:8.1f} tok/s ({row['tandem_tok_s'] / row['cb_tok_s']:.2f}x)"
               if "cb_tok_s" in row else f", transformers CB failed: {row['cb_error']}"))
        rows.append(row)
    return rows


def _continuous_batching(model, config, prompts, max_tokens: int) -> tuple[float, int]:
    """transformers' continuous batching on the prompts: seconds from handing them in to the last
    result (its warm-up, CUDA graph capture included, left out, as the engine's start is), tokens."""
    from transformers.generation.continuous_batching.utils import WorkloadHints

    hints = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=max_tokens,
                          num_requests=len(prompts))
    with torch.no_grad(), model.continuous_batching_context_manager(
            generation_config=config, block=True, timeout=5, workload_hints=hints) as manager:
        start = time.perf_counter()
        manager.add_requests(inputs=[list(p) for p in prompts], max_new_tokens=max_tokens)
        finished, tokens = 0, 0
        while finished < len(prompts):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                finished += 1
                tokens += len(result.generated_tokens)
            elif result is None and not manager.is_running():
                raise RuntimeError("the continuous batching thread stopped")
        return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes on the CPU: a dry run of the script")
    parser.add_argument("--out", default=None, help="folder for gpu-check.json")
    parser.add_argument("--only", default="ceilings,reference,lossless,sampling,steps,throughput")
    args = parser.parse_args()
    device = torch.device("cpu" if args.small or not torch.cuda.is_available() else "cuda")
    parts = set(args.only.split(","))
    shape = TINY if args.small else QWEN_15B
    figures: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                     "torch": torch.__version__}
    log(f"device {figures['device']}, torch {torch.__version__}")
    started = time.perf_counter()
    checks = [("ceilings", lambda: check_ceilings(device, args.small)),
             ("reference", lambda: check_reference(device, shape, args.small)),
             ("lossless_fp32", lambda: check_lossless(device, shape, torch.float32, args.small)),
             ("lossless_bf16", lambda: check_lossless(device, shape, torch.bfloat16, args.small)),
             ("sampling", lambda: check_sampling(device, 2000 if args.small else 20000)),
             ("spec", lambda: check_spec(device, shape, args.small)),
             ("device_profile", lambda: check_device_profile(device, shape, args.small, args.out))]
    for name, step in checks:
        if name in parts or name.split("_")[0] in parts:
            try:
                figures[name] = step()
            except Exception as error:
                log(f"[{name}] failed: {type(error).__name__}: {error}")
                figures[name] = {"error": str(error)[:500]}
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if parts & {"steps", "throughput", "profile", "sdpa"}:
        model = build_hf_model(shape, torch.bfloat16, device, seed=3)
        runner = fused_runner(model, torch.bfloat16, device, 64 if not args.small else 8, "target-bf16")
        if "steps" in parts:
            figures["steps"] = check_steps(runner, [1, 8] if args.small else [1, 8, 32, 64],
                                           [1, 2, 4, 8, 16])
        if "sdpa" in parts:
            figures["sdpa"] = check_sdpa(runner, shape)
        if "profile" in parts:
            figures["profile"] = check_profile(runner, shape)
        if "throughput" in parts:
            figures["throughput"] = check_throughput(model, runner, shape, [1, 4] if args.small else [1, 16, 64],
                                                     64 if args.small else 256, 16 if args.small else 128)
    figures["seconds"] = time.perf_counter() - started
    log(f"done in {figures['seconds']:.0f} s")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu-check.json").write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
