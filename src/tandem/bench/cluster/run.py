"""The cluster benchmark: one cluster launch, several configurations on the same actors.

- `single`: the same target (and draft) models in one process with all of this machine's
  threads, the batching engine: what the cluster has to beat on the same hardware,
- `solo`: each verifier replica of the cluster alone (the same actor, the file's drafting): what
  each device does on its own; their sum is what a cluster that adds up reaches,
- `cluster`: the router over the cluster file's Ray workers (each replica an engine), the
  file's drafting,
- `cluster+draft-ahead`: the same, drafters drafting round i+1 while round i verifies,
- `cluster-verify-only`: the same workers decoding without drafts (k = 0): the baseline of the
  cross-region case.
Configurations run one after another on the same requests (`repeats` times over); each run's
figures are in results.json, and every cluster configuration's figures, averaged over the
passes, also in the form `tandem simulate --measured` reads (measured.json,
measured-verify-only.json), with the prompt length of every request in the order sent and the
opening it shares with others (which a replica's prompt cache scores once), so the simulation
can replay them. Workers free a
sequence's cache when it leaves, so every run starts on an empty KV pool.
"""

import json
import sys
from pathlib import Path

from tandem.bench.cluster.drive import drive
from tandem.bench.workload import DEFAULT_WORKLOAD, format_prompt, load_prompts
from tandem.cluster.runtime.launch import ClusterOptions, check_one_tokenizer, launch_cluster, prepare_models
from tandem.cluster.runtime.router import ClusterRouter
from tandem.engine.request import GenerationRequest
from tandem.models.backends import RunnerSpec
from tandem.models.resolve import tokenizer_path
from tandem.engine.build import EngineConfig, build_engine
from tandem.numbers import is_number
from tandem.speculation.depth import parse_depth
from tandem.text.tokenizer import TextTokenizer
from tandem.engine.slots import MIN_COPY_TOKENS
from tandem.token_ids import common_prefix

CONFIGS = ("single", "solo", "cluster", "cluster+draft-ahead", "cluster-verify-only")


def requests_for(target_model: str, count: int, max_tokens: int, prompts_file=DEFAULT_WORKLOAD) -> list:
    tokenizer = TextTokenizer(str(tokenizer_path(target_model)))
    prompts = load_prompts(prompts_file)
    chosen = [prompts[(i * 7) % len(prompts)] for i in range(count)]  # spread over the categories
    return [GenerationRequest(format_prompt(tokenizer, p), max_tokens, stop_token_ids=tokenizer.stop_token_ids)
            for p in chosen]


def progress_line(message: str) -> None:
    """A run's progress, on stderr: stdout carries the report."""
    print(message, file=sys.stderr, flush=True)


def run_cluster_bench(cluster: ClusterOptions, drafter: str, k, concurrency: int, count: int, max_tokens: int,
                      configs: tuple[str, ...], out: Path, progress=progress_line, repeats: int = 1) -> dict:
    """Run `configs` in order, `repeats` times over (this machine drifts by 10% over minutes:
    repeating the whole sequence puts every configuration in each period). Entries of the
    first pass keep the configuration's name, later ones add " #2", " #3" ..."""
    target = cluster.target
    requests = requests_for(target.model, count, max_tokens)
    if "single" in configs:  # its models here, as a local cluster's: its own refusal of another tokenizer named --draft
        prepare_models(cluster.spec)
        check_one_tokenizer(cluster.spec)
        progress("loading the single-process engine ...")
    single = _single_engine(cluster, drafter, k, concurrency) if "single" in configs else None
    engine = None
    if any(c != "single" for c in configs):
        progress("starting the cluster ...")
        engine = launch_cluster(cluster.spec, drafter, k, cluster.ray_address, concurrency)
    results: dict[str, dict] = {}
    interrupted = False
    try:
        for index in range(1, repeats + 1):
            suffix = "" if index == 1 else f" #{index}"
            for name in configs:
                progress(f"{name}{suffix} ...")
                for cold in (single, engine):  # every run starts cold: no prompt cached by an earlier one
                    if cold is not None:
                        cold.clear_caches()
                if name == "single":
                    runs = {"single": drive(single, requests, concurrency, "single").to_json()}
                elif name == "solo":
                    runs = _solo_runs(engine, requests, concurrency, drafter, k, progress)
                else:
                    runs = {name: _cluster_run(engine, name, requests, concurrency, drafter, k)}
                results.update({key + suffix: figures for key, figures in runs.items()})
    except KeyboardInterrupt:  # Ctrl-C: the runs finished so far are written, then the interrupt goes on
        interrupted = True
        if not results:
            raise
    finally:
        if engine is not None:
            engine.close()
    report = {"cluster_file": cluster.spec.source, "drafter": drafter, "k": str(k), "concurrency": concurrency,
              "requests": count, "max_tokens": max_tokens, "repeats": repeats, "results": results,
              "summary": summarize(results), **({"interrupted": True} if interrupted else {})}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    for name in configs:  # each cluster run, in the form `tandem simulate --measured` reads
        if name.startswith("cluster") and name in results:
            measured = {**measured_figures(results, name), "concurrency": concurrency, "max_tokens": max_tokens,
                        "prompt_tokens": [len(r.prompt_ids) for r in requests],
                        "prompt_prefixes": prompt_prefixes([r.prompt_ids for r in requests]),
                        "note": f"tandem bench-cluster, {name}"}
            (out / measured_file(name)).write_text(json.dumps(measured))
    (out / "report.md").write_text(markdown(report))
    if interrupted:
        progress(f"interrupted: wrote the {len(results)} run{'s' if len(results) != 1 else ''} finished to {out}")
        raise KeyboardInterrupt
    return report


def prompt_prefixes(prompts: list) -> list:
    """Per prompt, the opening it shares with another (a system prompt): [group, tokens], the
    group being the first prompt that opens with the same MIN_COPY_TOKENS tokens; None where it
    shares fewer than MIN_COPY_TOKENS with every other prompt (the engine would not reuse them)."""
    groups: dict[tuple, int] = {}
    prefixes = []
    for i, prompt in enumerate(prompts):
        shared = max((common_prefix(prompt, other) for j, other in enumerate(prompts) if j != i), default=0)
        if shared < MIN_COPY_TOKENS:
            prefixes.append(None)
            continue
        prefixes.append([groups.setdefault(tuple(prompt[:MIN_COPY_TOKENS]), i), shared])
    return prefixes


def measured_file(config: str) -> str:
    """measured.json for `cluster`, measured-draft-ahead.json for `cluster+draft-ahead`, and so on."""
    return "measured.json" if config == "cluster" else f"measured-{config[len('cluster') + 1:]}.json"


def measured_figures(results: dict[str, dict], name: str) -> dict:
    """A configuration's figures over its passes: every number is the mean of the passes' (this
    VM drifts by 10% over minutes, so one pass is a noisy thing to hold a simulation to); the
    rest is the first pass's. `passes` says how many."""
    runs = _by_config(results)[name]
    merged = dict(runs[0])
    for field, value in runs[0].items():
        values = [run.get(field) for run in runs]
        numbers = all(is_number(v) for v in values)
        if numbers and len(set(values)) > 1:
            merged[field] = round(sum(values) / len(values), 3)
    return {**merged, "passes": len(runs)}


def _by_config(results: dict[str, dict]) -> dict[str, list[dict]]:
    """Each configuration's runs, first pass first ("cluster", "cluster #2", ... -> "cluster")."""
    runs: dict[str, list[dict]] = {}
    for key, figures in results.items():
        runs.setdefault(key.split(" #")[0], []).append(figures)
    return runs


def _single_engine(cluster: ClusterOptions, drafter: str, k, concurrency: int):
    """The same target (and draft) models in one process with all of this machine's threads, and
    the replicas' prefill floor (read off the profile), so solo and cluster run the same engine."""
    target = cluster.target
    draft = next((w for w in cluster.spec.workers if w.can_draft and w.drafting_model), None)
    config = EngineConfig(RunnerSpec(target.model, target.backend, target.device, target.dtype),
                          RunnerSpec(draft.drafting_model, draft.backend) if draft else None,
                          drafter if draft else "ngram", k, prefill_floor=None)
    return build_engine(config, concurrency)


def _cluster_run(engine: ClusterRouter, name: str, requests: list, concurrency: int, drafter: str, k) -> dict:
    engine.default_drafter = "none" if name == "cluster-verify-only" else drafter
    engine.default_depth = parse_depth(0 if name == "cluster-verify-only" else k)
    engine.set_draft_ahead(name == "cluster+draft-ahead")
    engine.decisions.clear()
    figures = drive(engine, requests, concurrency, name.replace("-", "_")).to_json()
    return {**figures, "placements": {f"{replica} {reason}": n for (replica, reason), n in engine.decisions.items()}}


def summarize(results: dict[str, dict]) -> dict[str, dict]:
    """Per configuration (repeats folded together): the throughput of every pass and their
    mean, and for the cluster configurations the mean over the mean of the solo sums."""
    passes = {name: [run["throughput_tok_s"] for run in runs] for name, runs in _by_config(results).items()}
    summary = {name: {"throughput_tok_s": values, "mean": sum(values) / len(values)} for name, values in passes.items()}
    solo_sum = summary.get("solo sum", {}).get("mean")
    if solo_sum:
        for name, entry in summary.items():
            if name.startswith("cluster"):
                entry["x_solo_sum"] = entry["mean"] / solo_sum
    return summary


def _solo_runs(engine: ClusterRouter, requests: list, concurrency: int, drafter: str, k, progress) -> dict:
    """Each verifier replica alone, on its running actor, with the cluster's drafters."""
    engine.close()  # its polls would take the solo router's news
    results, total = {}, 0.0
    for replica in engine.verifiers:
        progress(f"solo {replica.name} ...")
        solo = ClusterRouter([replica], engine.drafter_workers, drafter, k, concurrency,
                             rtt_between=engine.rtt_between)
        solo.clear_caches()
        figures = drive(solo, requests, concurrency, f"solo_{replica.name}".replace("-", "_")).to_json()
        solo.close()
        results[f"solo {replica.name}"] = figures
        total += figures["throughput_tok_s"]
    results["solo sum"] = {"throughput_tok_s": total, "note": "the sum of the solo runs' throughputs"}
    return results


def markdown(report: dict) -> str:
    head = (f"# Cluster benchmark\n\n{report['cluster_file']}: drafter {report['drafter']}, k {report['k']}, "
            f"{report['requests']} requests of {report['max_tokens']} tokens at concurrency {report['concurrency']}"
            f"{_passes(report)}.\n\n")
    if report.get("interrupted"):
        head += "**Interrupted**: only the runs below finished.\n\n"
    return head + _runs_table(report) + _summary_table(report)


def _passes(report: dict) -> str:
    repeats = report.get("repeats", 1)
    return f", the configurations run {repeats} times in turn" if repeats > 1 else ""


def _runs_table(report: dict) -> str:
    rows = ["| config | tok/s | latency p50 ms | latency p99 ms | TTFT p50 ms | ms/token p50 | acceptance |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in report["results"].items():
        if "latency_ms_p50" not in r:  # a derived figure
            rows.append(f"| {name} | {r['throughput_tok_s']:.1f} | | | | | |")
            continue
        acceptance = "—" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        rows.append(f"| {name} | {r['throughput_tok_s']:.1f} | {r['latency_ms_p50']:.0f} | {r['latency_ms_p99']:.0f} "
                    f"| {r['ttft_ms_p50']:.0f} | {r['ms_per_token_p50']:.1f} | {acceptance} |")
    return "\n".join(rows) + "\n"


def _summary_table(report: dict) -> str:
    if report.get("repeats", 1) < 2:
        return ""
    rows = ["", "## Over the passes", "", "| config | tok/s, each pass | mean | x solo sum |", "|---|---|---:|---:|"]
    for name, entry in report["summary"].items():
        each = ", ".join(f"{v:.1f}" for v in entry["throughput_tok_s"])
        ratio = f"{entry['x_solo_sum']:.2f}" if "x_solo_sum" in entry else ""
        rows.append(f"| {name} | {each} | {entry['mean']:.1f} | {ratio} |")
    return "\n".join(rows) + "\n"
