"""Explain a `Plan` at the terminal (a table per section) or as JSON.

Text: the chosen placement with its predicted step breakdown per verifier group, the runners-up,
and the naive article rule side by side with ours. Every number is a model prediction from the
workers' cost curves, and the text says so.
"""

import math

from tandem.cluster.planning.naive_score import NAIVE_K
from tandem.cluster.planning.placement import Assignment, Placement
from tandem.cluster.planning.planner import Plan

_ASSIGNMENT_COLUMNS = ("verifier", "replicas", "drafter", "k", "batch", "verify ms", "draft ms", "net ms",
                       "step ms", "tok/step", "tok/s", "ms/tok", "ms/tok@1")


def plan_text(plan: Plan, source: str | None = None) -> str:
    options = plan.options
    target = "none" if options.latency_target_ms is None else f"{options.latency_target_ms:g} ms/token"
    accept = ", ".join(f"{k} {v:.2f}" for k, v in sorted(options.acceptance.items()))
    header = (f"Plan for {source or 'cluster'} (predicted from cost curves; latency target {target}; "
              f"context {options.context_tokens} tokens; acceptance {accept})")
    lines = [header, ""]
    if not plan.meets_target:
        lines += ["No placement meets the latency target; the lowest-latency placement (batch 1) is shown.", ""]
    lines += [f"Chosen: {_summary(plan.chosen)}"]
    lines += _indent(_table(_ASSIGNMENT_COLUMNS, [_assignment_row(a) for a in plan.chosen.assignments]))
    lines += _indent(_roles(plan.chosen))
    lines += ["", "Runners-up (the best of each other drafter kind, then the next best):"]
    rows = [(_shown(p), _num(p.tokens_per_s), _num(p.latency_ms), _num(p.latency_b1_ms), _verifiers(p))
            for p in plan.runners_up]
    lines += _indent(_table(("plan", "tok/s", "ms/tok", "ms/tok@1", "verifiers"), rows))
    lines += [""] + _naive_lines(plan)
    return "\n".join(lines)


def _shown(p: Placement) -> str:
    """A placement's plan as it runs: a drafting kind whose every replica fell back to plain
    decoding (no draft worker to run it) decodes plainly, whatever it was asked to draft."""
    if p.drafter_kind != "none" and not p.drafts:
        return f"none ({p.drafter_kind} k={p.k} fell back)"
    return p.label()


def _summary(p: Placement) -> str:
    return (f"drafter {p.drafter_kind}, k={p.k}: {_num(p.tokens_per_s)} tokens/s at saturation, "
            f"{_num(p.latency_ms)} ms/token at that load, {_num(p.latency_b1_ms)} ms/token alone")


def _assignment_row(a: Assignment) -> tuple[str, ...]:
    s = a.step
    return (a.verifier, str(a.replicas), a.drafter, str(s.k), str(s.batch), _num(s.verify_ms), _num(s.draft_ms),
            _num(s.network_ms), _num(s.step_ms), _num(s.batch * s.tokens_per_sequence),
            _num(a.tokens_per_s), _num(s.latency_ms), _num(a.batch1.latency_ms))


def _roles(p: Placement) -> list[str]:
    lines = []
    if p.drafting:
        busy = ", ".join(f"{name} x{n} ({share:.0%} busy)" for name, n, share in p.drafting)
        lines.append(f"drafting: {busy}")
    for name, n, why in p.idle:
        lines.append(f"idle: {name} x{n} ({why})")
    return lines


def _verifiers(p: Placement) -> str:
    return ", ".join(f"{name} x{n}" for name, n in p.verifying.items()) or "-"


def _naive_lines(plan: Plan) -> list[str]:
    if plan.naive is None:
        return [f"Naive article rule: {plan.naive_note}"]
    naive = plan.naive
    lines = ["Naive article rule: score = (0.6 x compute + 0.4 x bandwidth, each / cluster max) x (1 - utilisation)"]
    rows = [(s.worker, f"{s.compute_tflops:.3g}", f"{s.bandwidth_gbs:.3g}", f"{s.utilization:.2f}",
             f"{s.score:.3f}", s.basis) for s in sorted(naive.scores, key=lambda s: -s.score)]
    lines += _indent(_table(("worker", "TFLOP/s", "GB/s", "util", "score", "from"), rows))
    drafters = ", ".join(n for n, _, _ in naive.article.drafting) or "none used"
    lines.append(f"  naive placement: verify on {_verifiers(naive.article)}; drafters {drafters}")
    target = plan.options.latency_target_ms
    compare = [("ours", plan.chosen), (f"naive (model, k={NAIVE_K})", naive.article),
               ("naive roles, our kind/k", naive.tuned)]
    rows = [(name, _shown(p), _num(p.tokens_per_s), _num(p.latency_ms), _num(p.latency_b1_ms),
             "yes" if target is None or p.latency_ms <= target else "no") for name, p in compare]
    lines += _indent(_table(("placement", "plan", "tok/s", "ms/tok", "ms/tok@1", "meets target"), rows))
    ratio = plan.chosen.tokens_per_s / naive.article.tokens_per_s if naive.article.tokens_per_s else math.inf
    lines.append(f"  predicted: ours / naive = {ratio:.2f}x tokens/s")
    return lines


def _num(x: float) -> str:
    if math.isinf(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    rows = [header] + rows
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _indent(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def plan_json(plan: Plan) -> dict:
    data = {"meets_target": plan.meets_target, "latency_target_ms": plan.options.latency_target_ms,
            "acceptance": dict(plan.options.acceptance), "context_tokens": plan.options.context_tokens,
            "chosen": placement_json(plan.chosen), "runners_up": [placement_json(p) for p in plan.runners_up]}
    if plan.naive is not None:
        data["naive"] = {"scores": [{"worker": s.worker, "compute_tflops": s.compute_tflops,
                                     "bandwidth_gbs": s.bandwidth_gbs, "utilization": s.utilization,
                                     "score": s.score, "basis": s.basis} for s in plan.naive.scores],
                         "article": placement_json(plan.naive.article), "tuned": placement_json(plan.naive.tuned)}
    else:
        data["naive"] = {"note": plan.naive_note}
    return data


def placement_json(p: Placement) -> dict:
    return {
        "drafter": p.drafter_kind, "k": p.k, "tokens_per_s": _finite(p.tokens_per_s),
        "latency_ms": _finite(p.latency_ms), "latency_batch1_ms": _finite(p.latency_b1_ms),
        "assignments": [{"verifier": a.verifier, "replicas": a.replicas, "drafter": a.drafter,
                         "batch": a.step.batch, "k": a.step.k, "verify_ms": a.step.verify_ms,
                         "draft_ms": a.step.draft_ms, "network_ms": a.step.network_ms,
                         "step_ms": a.step.step_ms, "tokens_per_s": a.tokens_per_s,
                         "latency_ms": a.step.latency_ms, "latency_batch1_ms": a.batch1.latency_ms}
                        for a in p.assignments],
        "drafting": [{"worker": n, "replicas": r, "busy": share} for n, r, share in p.drafting],
        "idle": [{"worker": n, "replicas": r, "why": why} for n, r, why in p.idle],
    }


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x
