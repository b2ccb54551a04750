"""A SimResult as lines for the terminal."""

from tandem.cluster.sim.metrics import SimResult

MAX_DEVICES_LISTED = 8  # beyond this, utilisation is averaged per worker


def summary_lines(result: SimResult, heading: str) -> list[str]:
    lines = [
        heading,
        (f"  throughput    {result.throughput_tok_s:,.1f} tok/s   ({result.requests_per_s:.2f} requests/s, "
         f"{result.output_tokens} tokens in {result.duration_s:.2f} s simulated)"),
        "  steady        " + (f"{result.steady_tok_s:,.{1 if result.steady_tok_s >= 1 else 3}f} tok/s until the "
                               "last request arrived" if result.steady_tok_s is not None
                               else "n/a (every request arrived at once, or none finished a token before the last did)"),
        "  latency ms    " + _percentiles(result.latency_ms),
        "  TTFT ms       " + _percentiles(result.ttft_ms),
        *(["  TTFT p50 ms by turn  " + " / ".join(f"{ms:,.0f}" for ms in result.ttft_ms_p50_by_turn.values())]
          if result.ttft_ms_p50_by_turn else []),
        "  ITL ms        " + _percentiles(result.itl_ms),
        f"  mean k {result.mean_k:.2f}   acceptance {result.acceptance:.3f} (accepted / drafted)   "
        f"moves {result.moves}",
        f"  tokens scored {result.scored_tokens:,}   reused from prompt caches {result.reused_tokens:,}",
        "  placements    " + ", ".join(f"{reason} {count}" for reason, count in result.placements.items()),
        "  utilisation   " + "  ".join(f"{name} {u:.0%}" for name, u in _utilisation(result).items()),
    ]
    return lines


def comparison_lines(comparison: dict) -> list[str]:
    lines = ["against the measurement:", *_figure_lines(comparison)]
    at_speed = comparison.get("at_run_speed")
    if at_speed:
        lines.append(f"at the run's device speed (its calls took {at_speed['device_speed']:.2f}x the time "
                     "simulated above):")
        lines.extend(_figure_lines(at_speed))
    return lines


def _figure_lines(comparison: dict) -> list[str]:
    lines = [f"  {name:18s} predicted {figure['predicted']:,.1f}  measured {figure['measured']:,.1f}  "
             f"error {figure['relative_error']:+.1%}" for name, figure in comparison["figures"].items()]
    tolerance, figures = comparison["tolerance"], comparison["figures"]
    outside = [label for name, label in (("throughput_tok_s", "throughput"), ("latency_ms_p50", "p50 latency"))
               if name in figures and abs(figures[name]["relative_error"]) > tolerance]
    if outside:
        lines.append(f"  {' and '.join(outside)} NOT within {tolerance:.0%}"
                     + (" (throughput within)" if outside == ["p50 latency"] else
                        " (p50 latency within)" if outside == ["throughput"] else ""))
    else:
        lines.append(f"  throughput and p50 latency within {tolerance:.0%}")
    return lines


def _percentiles(values: dict[str, float]) -> str:
    return "   ".join(f"{name} {value:,.1f}" for name, value in values.items())


def _utilisation(result: SimResult) -> dict[str, float]:
    if len(result.utilisation) <= MAX_DEVICES_LISTED:
        return result.utilisation
    groups: dict[str, list[float]] = {}
    for name, u in result.utilisation.items():
        groups.setdefault(name.split("/")[0] + " (mean)", []).append(u)
    return {name: sum(us) / len(us) for name, us in groups.items()}
