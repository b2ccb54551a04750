"""Multi-turn conversations on a 2-replica cluster: do later turns find their history cached?

Starts `tandem serve --cluster` on two verifier replicas (llama.cpp, one thread each), runs
bench-serve's multi-turn scenarios against it (`chat`: 10 users x 3 turns, each first message a
~700-token source file; `shared_system`: 16 users behind one ~1,900-token system prompt), and
prints the time to first token by turn, the prompt share the replicas' prompt caches held, and
the router's placement decisions by reason from /metrics (`tandem:cluster_routed_requests_total`).

    python scripts/measure_cluster_multiturn.py [--model smollm2-135m-instruct] [--max-tokens 48] [--out DIR]

With --out, DIR gets the cluster file and, per scenario, SCENARIO.json: every conversation's
turns (prompt and completion tokens, TTFT, cached tokens), the TTFT p50 by turn, the router's
placements and the replicas' call seconds during that scenario, which `tandem simulate
--cluster DIR/cluster.yaml --conversations DIR/SCENARIO.json` replays (again at the run's
device speed).

Name the CPU beside the figures (printed).
"""

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem.bench.serve.conversations import CONCURRENCY, load_scenarios, run_scenario, summarize_scenario
from tandem.hardware import cpu_model
from tandem.serve.settings import ServeSettings

CLUSTER = """
workers:
  - name: verify
    role: verify
    model: {model}
    backend: llamacpp
    threads: 1
    replicas: 2
    resources: {{CPU: 1}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--scenarios", default="chat,shared_system")
    parser.add_argument("--out", default=None, help="folder for the cluster file and each scenario's turns")
    args = parser.parse_args()
    scenarios = load_scenarios()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(args.out or folder) / "cluster.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CLUSTER.format(model=args.model))
        process, url = _start(path)
        try:
            rows = []
            before, calls_before = {}, _call_seconds(url)
            for name in args.scenarios.split(","):
                run = run_scenario(f"{url}/v1/chat/completions", name, scenarios[name], args.model, args.max_tokens, {},
                                   CONCURRENCY[name])
                rows.append(summarize_scenario(run))
                decisions, calls = _placements(url), _call_seconds(url)
                if args.out:
                    during = {key: count - before.get(key, 0) for key, count in decisions.items()}
                    _write_turns(Path(args.out) / f"{name}.json", run, rows[-1], during, calls - calls_before, args)
                before, calls_before = decisions, calls
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    print(f"CPU: {cpu_model()}; {args.model} on 2 llama.cpp replicas, 1 thread each; {args.max_tokens}-token answers")
    print("| scenario | wall s | TTFT p50 ms by turn | cached prompt share | errors |")
    print("|---|---:|---|---:|---:|")
    for row in rows:
        turns = " / ".join(f"{v:.0f}" for v in row["ttft_p50_ms_by_turn"].values())
        print(f"| {row['scenario']} | {row['wall_s']:.1f} | {turns} | {row['cached_share']} | {row['errors']} |")
    print("placements:", ", ".join(f"{key}: {n}" for key, n in sorted(before.items())))


def _placements(url: str) -> dict[str, int]:
    """The router's placements so far, "worker reason" -> requests (/metrics)."""
    routed = re.findall(r'tandem:cluster_routed_requests_total\{[^}]*reason="(\w+)"[^}]*worker="([^"]+)"[^}]*\} (\S+)|'
                        r'tandem:cluster_routed_requests_total\{[^}]*worker="([^"]+)"[^}]*reason="(\w+)"[^}]*\} (\S+)',
                        httpx.get(f"{url}/metrics").text)
    decisions = {}
    for match in routed:
        reason, worker, count = (match[0], match[1], match[2]) if match[0] else (match[4], match[3], match[5])
        decisions[f"{worker} {reason}"] = int(float(count))
    return decisions


def _call_seconds(url: str) -> float:
    """The replicas' model calls so far, in seconds: the sums of /metrics' prefill, draft and
    verify step histograms (what `tandem bench-cluster` counts as `call_seconds`)."""
    families = ("tandem:prefill_step_seconds", "tandem:draft_step_seconds", "tandem:verify_step_seconds")
    return sum(sample.value for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
               if family.name in families for sample in family.samples if sample.name.endswith("_sum"))


def _write_turns(path: Path, run, summary: dict, placements: dict[str, int], call_seconds: float, args) -> None:
    """The scenario's conversations, turn by turn, in the order the workload lists them."""
    conversations: dict[str, list[dict]] = {}
    for turn in sorted(run.turns, key=lambda t: t.turn):
        record = turn.record
        conversations.setdefault(turn.conversation_id, []).append(dict(
            turn=turn.turn, ok=record.ok, prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens, cached_tokens=record.cached_tokens,
            ttft_ms=None if record.ttft_s is None else round(1000 * record.ttft_s, 1)))
    order = [c.conversation_id for c in load_scenarios()[run.scenario]]
    path.write_text(json.dumps({
        "scenario": run.scenario, "cpu": cpu_model(), "model": args.model, "max_tokens": args.max_tokens,
        "concurrency": run.concurrency, "max_running": ServeSettings().max_running, "wall_s": summary["wall_s"],
        "ttft_p50_ms_by_turn": summary["ttft_p50_ms_by_turn"], "cached_share": summary["cached_share"],
        "placements": placements, "call_seconds": round(call_seconds, 3),
        "conversations": [conversations[c] for c in order if c in conversations],
    }, indent=1))


def _start(cluster: Path):
    command = [sys.executable, "-m", "tandem.cli.main", "serve", "--cluster", str(cluster), "--port", "0",
               "--cache", "off"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        match = re.search(r"http://127\.0\.0\.1:\d+", line)
        if match:
            url = match.group(0)
            break
    else:
        raise SystemExit("the server did not start")
    threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # keep the pipe drained
    for _ in range(600):  # the workers load their models
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not become healthy")


if __name__ == "__main__":
    main()
