"""A/B in one process: the engine's prompt-chunk floor, a fixed 48 tokens against the floor read
off the target's profile (`floor_chunk`), on the 1.5B Q4 target (llama.cpp, two threads): twelve
300-450-token prompts of random tokens, 40 greedy tokens each, a closed loop at C=4, so each
prompt goes in beside three decoding streams. Prints wall time and inter-token gaps per pass.

    python scripts/prefill_floor_ab.py
"""

import time

import tandem.engine.step_budget as step_budget
from tandem.engine.build import EngineConfig, build_engine
from tandem.engine.request import GenerationRequest
from tandem.models.backends import RunnerSpec

CONCURRENCY = 4
PROMPTS = [tuple((i * 7919 + j * 104729 + 13) % 150000 + 1000 for j in range(300 + 37 * (i % 5))) for i in range(12)]


def run(engine, tag: str) -> tuple[float, float, float]:
    pending, live, last, gaps = list(enumerate(PROMPTS)), set(), {}, []
    start = time.perf_counter()
    while pending or engine.has_work:
        while pending and len(live) < CONCURRENCY:
            index, prompt = pending.pop(0)
            engine.add(f"{tag}-{index}", GenerationRequest(prompt, max_tokens=40))
            live.add(f"{tag}-{index}")
        updates, _ = engine.step()
        now = time.perf_counter()
        for update in updates:
            if update.token_ids:
                if update.seq_id in last:
                    gaps.append((now - last[update.seq_id]) * 1000)
                last[update.seq_id] = now
            if update.finished:
                live.discard(update.seq_id)
    gaps.sort()
    return time.perf_counter() - start, gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.99)]


def main() -> None:
    target = RunnerSpec("qwen2.5-coder-1.5b-instruct", backend="llamacpp", threads=2)
    engine = build_engine(EngineConfig(target, None, "none", 0), max_running=8, cache_ram_bytes=0)
    from_profile = step_budget.floor_chunk
    print(f"floor read off this profile: {from_profile(engine.target.cost.profiled_ms)} tokens")
    for index in (1, 2):
        for name, floor in (("fixed 48", lambda cost_ms: 48), ("from the profile", from_profile)):
            step_budget.floor_chunk = floor
            wall, p50, p99 = run(engine, f"{name.replace(' ', '-')}-{index}")
            print(f"{name}, pass {index}: wall {wall:.1f} s, ITL p50 {p50:.0f} ms, p99 {p99:.0f} ms", flush=True)
    step_budget.floor_chunk = from_profile


if __name__ == "__main__":
    main()
