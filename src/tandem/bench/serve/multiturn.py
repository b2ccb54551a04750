"""`bench-serve --prompts multiturn` from settings to files: every server started once (Tandem with
its default 8 running sequences), then each scenario of bench/serve/conversations.py against
every server in turn, the order alternating from one scenario to the next. Outputs under
`out_dir`: results.json, report.md and logs/<config>.log.
"""

import json
import sys
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from tandem.bench.machine import machine_info
from tandem.bench.serve.client import answer_tokens_only
from tandem.bench.serve.conversations import CONCURRENCY, SCENARIOS, load_scenarios, run_scenario, summarize_scenario
from tandem.bench.serve.server_kinds import SERVER_KINDS
from tandem.bench.serve.session import LOG_FOLDER, server_launch
from tandem.bench.serve.settings import ServeBenchSettings
from tandem.bench.serve.sweep import config_order, start_servers
from tandem.bench.out_dir import prepare_out_dir
from tandem.engine.build import DEFAULT_MAX_RUNNING
from tandem.errors import InterruptSaid

PEERS = ("llama-server-auto", "llama-server")  # the first that ran is what ratios compare against


def run_multiturn_bench(settings: ServeBenchSettings) -> dict:
    kinds = [SERVER_KINDS[name]() for name in settings.configs]
    scenarios = load_scenarios()
    launch = replace(server_launch(settings, kinds), max_running=DEFAULT_MAX_RUNNING)
    prepare_out_dir(settings.out_dir)
    results = {"command": settings.command,
               "settings": {"target": settings.target, "draft": settings.draft, "configs": list(settings.configs),
                            "max_tokens": settings.max_tokens, "threads": launch.threads,
                            "tandem_max_running": launch.max_running, "context_length": launch.context_length},
               "machine": machine_info(), "scenarios": []}
    try:
        with ExitStack() as servers:
            endpoints, results["servers"] = start_servers(servers, kinds, launch, settings.max_tokens,
                                                          settings.out_dir / LOG_FOLDER)
            for index, scenario in enumerate(SCENARIOS):
                results["scenarios"].append(run_scenario_on_all(scenario, scenarios[scenario], index, kinds,
                                                                endpoints, settings))
    except KeyboardInterrupt:  # Ctrl-C: the scenarios every server finished are kept, then the interrupt goes on
        if results["scenarios"]:
            write_multiturn_outputs(results | {"interrupted": True}, settings.out_dir)
            print(f"\ninterrupted: wrote the finished scenarios "
                  f"({', '.join(entry['scenario'] for entry in results['scenarios'])}) to {settings.out_dir}",
                  file=sys.stderr)
            raise InterruptSaid() from None
        raise
    write_multiturn_outputs(results, settings.out_dir)
    return results


def run_scenario_on_all(scenario: str, conversations, index: int, kinds: list, endpoints: dict,
                        settings: ServeBenchSettings) -> dict:
    """One scenario against every server in turn (the order alternating with `index`)."""
    order = config_order(kinds, index)
    entry = {"scenario": scenario, "order": [kind.label for kind in order], "configs": {}}
    for kind in order:
        endpoint = endpoints[kind.label]
        run = run_scenario(endpoint.chat_url, scenario, conversations, endpoint.model, settings.max_tokens,
                           dict(kind.request_extras), CONCURRENCY[scenario])
        if kind.usage_counts_end_token:  # counted as the answer's tokens, as every server's
            run = replace(run, turns=tuple(replace(t, record=answer_tokens_only(t.record)) for t in run.turns))
        summary = summarize_scenario(run)
        print(f"{scenario} {kind.label}: {summary['requests']} requests in {summary['wall_s']:.1f} s, "
              f"TTFT p50 by turn {', '.join(f'{turn}: {ms:.0f}' for turn, ms in summary['ttft_p50_ms_by_turn'].items())} ms"
              + (f", {summary['errors']} errors" if summary["errors"] else ""), file=sys.stderr)
        entry["configs"][kind.label] = {**summary, "turns": [
            {"conversation": t.conversation_id, "turn": t.turn, "ok": t.record.ok, "error": t.record.error,
             "ttft_ms": None if t.record.ttft_s is None else round(1000 * t.record.ttft_s, 1),
             "e2e_ms": None if t.record.e2e_s is None else round(1000 * t.record.e2e_s, 1),
             "prompt_tokens": t.record.prompt_tokens, "cached_tokens": t.record.cached_tokens,
             "completion_tokens": t.record.completion_tokens} for t in run.turns]}
    return entry


def write_multiturn_outputs(results: dict, out_dir: Path) -> None:
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    (out_dir / "report.md").write_text("\n".join(multiturn_report(results)) + "\n")


def multiturn_table(results: dict) -> list[str]:
    """Per scenario and server: wall, TTFT p50 by turn, cached share, and the peer's wall over this one's."""
    lines = ["| scenario | server | wall s | vs peer (wall) | TTFT p50 by turn, s | cached prompt share |",
             "|---|---|---:|---:|---|---:|"]
    for entry in results["scenarios"]:
        configs = entry["configs"]
        peer = next((configs[p] for p in PEERS if p in configs), None)
        for label in results["settings"]["configs"]:
            summary = configs[label]
            ratio = f"{peer['wall_s'] / summary['wall_s']:.2f}x" if peer and summary["wall_s"] else "—"
            ttft = " / ".join(f"{ms / 1000:.1f}" for ms in summary["ttft_p50_ms_by_turn"].values())
            share = "—" if summary["cached_share"] is None else f"{summary['cached_share']:.0%}"
            errors = f" ({summary['errors']} errors)" if summary["errors"] else ""
            lines.append(f"| {entry['scenario']} | {label}{errors} | {summary['wall_s']:.1f} | {ratio} | {ttft} | "
                         f"{share} |")
    return lines


def multiturn_report(results: dict) -> list[str]:
    machine = results["machine"]
    lines = ["# bench-serve --prompts multiturn", "", f"`{results['command']}`", "",
             f"Machine: {machine.get('cpu_model', '?')}, {machine.get('cpu_count', '?')} cores. Greedy, "
             f"{results['settings']['max_tokens']} new tokens a turn, {results['settings']['threads']} threads "
             f"per server; Tandem runs {results['settings']['tandem_max_running']} sequences at once. Scenarios: "
             "chat (10 users x 3 turns, at once), agent (4 loops x 4 turns), shared_system (16 users, 4 at a "
             "time, one ~1,900-token system prompt). vs peer: the peer's wall time over this server's "
             "(above 1: faster).", ""]
    if results.get("interrupted"):
        lines += ["**Interrupted**: only the scenarios every server finished are here.", ""]
    lines += [*multiturn_table(results), "", "## Servers", ""]
    lines += [f"- `{label}`: {info['notes']}" for label, info in results["servers"].items()]
    return lines
