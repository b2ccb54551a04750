"""The transformers continuous-batching peer on smollm2-135m-instruct: a tiny closed loop (3 prompts,
C=2, 8 tokens, fp32 on CPU) completes with bench-serve's figures, and its greedy outputs equal plain
`model.generate` greedy outputs for the same prompt ids, token for token."""

import json

import pytest

from tandem.bench.workload import DEFAULT_WORKLOAD, load_prompts

SMALL = "smollm2-135m-instruct"
PROMPTS = 3
MAX_TOKENS = 8
CONCURRENCY = 2


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from tandem.bench.peers.transformers_cb import CbPeerSettings, run_peer_sweep

    folder = tmp_path_factory.mktemp("transformers-cb")
    prompts = folder / "prompts.jsonl"
    prompts.write_text("\n".join(DEFAULT_WORKLOAD.read_text().splitlines()[:PROMPTS]) + "\n")
    settings = CbPeerSettings(model=SMALL, concurrency=(CONCURRENCY,), prompts_file=prompts, out_dir=folder / "out",
                              dtype="fp32", device="cpu", num_prompts=PROMPTS, max_tokens=MAX_TOKENS, threads=1)
    return settings, run_peer_sweep(settings, progress=False)


def test_closed_loop_completes_with_bench_serve_figures(sweep):
    settings, results = sweep
    assert results == json.loads((settings.out_dir / "results.json").read_text())
    assert (settings.out_dir / "report.md").is_file()
    summary = results["levels"][0]["configs"]["transformers-cb"]
    assert summary["requests"] == PROMPTS and summary["errors"] == 0, summary["error_samples"]
    assert 0 < summary["completion_tokens"] <= PROMPTS * MAX_TOKENS
    assert summary["throughput_tok_s"] > 0 and summary["ttft_ms_p50"] > 0 and summary["itl_ms_p50"] > 0
    assert summary["peak_in_flight"] == CONCURRENCY


def test_greedy_outputs_equal_plain_generate(sweep):
    import torch

    from tandem.token_ids import cut_at_stop
    from tandem.bench.peers.transformers_cb import load_model, plan_levels
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    settings, results = sweep
    tokenizer = TextTokenizer(str(tokenizer_path(SMALL)))
    stops = tokenizer.stop_token_ids
    model = load_model(SMALL, "cpu", "fp32", "sdpa")
    (_, requests), = plan_levels(settings, load_prompts(settings.prompts_file))
    entries = results["levels"][0]["configs"]["transformers-cb"]["request_records"]
    differing = []
    for request, entry in zip(requests, entries, strict=True):
        ids = torch.tensor([tokenizer.chat_prompt_ids(list(request.messages))])  # [1, n]
        with torch.inference_mode():
            output = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    temperature=None, top_p=None, top_k=None, max_new_tokens=MAX_TOKENS,
                                    eos_token_id=sorted(stops), pad_token_id=min(stops))  # [1, n + new]
        reference = cut_at_stop(output[0, ids.shape[1]:].tolist(), stops, MAX_TOKENS)
        if entry["output_ids"] != reference:
            differing.append((entry["id"], entry["output_ids"], reference))
    assert not differing, f"{len(differing)}/{len(entries)} outputs differ from generate: {differing}"
