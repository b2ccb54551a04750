"""Did the server hold up? Checks on a soak's samples, each with its figure:
- the server answered to the end (a server that died or stopped answering fails, with what was seen);
- no failed request;
- resident memory after warm-up, less what fills up to a bound by design (the prompt cache's
  host tier, to its `--cache-ram` budget; the drafters' memory of earlier answers, the suffix
  index and n-gram store, as charged against their bounds, which is at or above what they hold),
  grows by less than `max_rss_growth` (the largest later sample over the first sample at or
  after the warm-up);
- once idle, no KV slot is held, and there are no more open file descriptors or threads than at
  the warm-up sample (a leak grows them with every request; a pool that fills once does not).
"""

from dataclasses import dataclass

from tandem.bench.soak.samples import ServerSample

MAX_RSS_GROWTH = 0.05


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    figure: str


def judge(samples: list[ServerSample], warmup_s: float, max_rss_growth: float = MAX_RSS_GROWTH,
          server_lost: str | None = None) -> list[Check]:
    if server_lost is not None:
        return [Check("server up", False, server_lost)]
    loaded = [s for s in samples if s.phase == "load"]
    idle = [s for s in samples if s.phase == "idle"]
    if not loaded or not idle:
        return [Check("samples", False, f"{len(loaded)} under load and {len(idle)} idle: the run was too short")]
    warm = next((s for s in loaded if s.elapsed_s >= warmup_s), loaded[-1])
    later = [s for s in samples if s.elapsed_s > warm.elapsed_s]
    end = idle[-1]
    checks = [Check("errors", end.errors == 0, f"{end.errors} failed of {end.requests_done} requests")]
    if warm.unbounded_bytes is not None and later:
        peak = max(s.unbounded_bytes for s in later if s.unbounded_bytes is not None)
        growth = peak / warm.unbounded_bytes - 1
        cache = max((s.prompt_cache_bytes or 0.0) for s in later)
        drafting = max((s.drafting_memory_bytes or 0.0) for s in later)
        checks.append(Check("rss growth after warm-up", growth < max_rss_growth,
                            f"{growth:+.1%} ({warm.unbounded_bytes / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB "
                            f"besides the prompt cache's host tier, peak {cache / 2**20:.0f} MiB, and the "
                            f"drafting memory, peak {drafting / 2**20:.0f} MiB charged; limit {max_rss_growth:.0%})"))
    if end.kv_slots_in_use is not None:
        checks.append(Check("kv slots when idle", end.kv_slots_in_use == 0, f"{end.kv_slots_in_use:.0f} held"))
    for name, field in (("open fds", "open_fds"), ("threads", "threads")):
        before, after = getattr(warm, field), getattr(end, field)
        if before is not None and after is not None:
            checks.append(Check(f"{name} growth", after <= before, f"{before:.0f} at warm-up -> {after:.0f} idle"))
    return checks
