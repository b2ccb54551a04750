"""bench-peer transformers-cb without a model: the sweep's bookkeeping around a stand-in peer."""

import json
from types import SimpleNamespace

import pytest

from tandem.bench.peers import transformers_cb
from tandem.bench.peers.transformers_cb import CbPeerSettings, LevelRun, run_peer_sweep
from tandem.bench.serve.client import RequestRecord
from tandem.bench.serve.loadgen import LoadResult
from tandem.bench.workload import DEFAULT_WORKLOAD


class InterruptedPeer:
    """Finishes the warm-up and the first level, then is interrupted (Ctrl-C) in the second."""

    def __init__(self, settings):
        self.device, self.levels, self.stopped = "cpu", [], False
        self.tokenizer = SimpleNamespace(chat_prompt_ids=lambda messages: [1, 2, 3])

    def start(self, max_running, longest_prompt):
        pass

    def run_level(self, requests, concurrency, on_done=None):
        self.levels.append(concurrency)
        if len(self.levels) == 3:  # warm-up, C=1, then C=4
            raise KeyboardInterrupt
        records = tuple(RequestRecord(r.prompt_id, r.category, True, ttft_s=0.1, e2e_s=0.5, completion_tokens=5,
                                      token_chunks=5, itl_s=(0.1,) * 4) for r in requests)
        return LevelRun(LoadResult(concurrency, records, wall_s=0.5, peak_in_flight=concurrency),
                        tuple((7,) * 5 for _ in requests))

    def info(self):
        assert not self.stopped, "info is read while the manager runs"
        return {"command": ["tandem"], "notes": "a stand-in", "base_url": None, "model": "m",
                "attn_implementation": "sdpa", "cb_config": {}}

    def stop(self):
        self.stopped = True


def test_an_interrupted_peer_sweep_keeps_its_finished_levels(tmp_path, monkeypatch):
    """Ctrl-C during C=4 after C=1 finished: results.json and report.md hold C=1, marked
    interrupted, the peer is stopped, and the interrupt goes on (exit 130)."""
    peers = []
    monkeypatch.setattr(transformers_cb, "TransformersCbPeer", lambda settings: peers.append(InterruptedPeer(settings))
                        or peers[-1])
    monkeypatch.setattr(transformers_cb, "hf_path", lambda model: tmp_path / "hf")
    settings = CbPeerSettings(model="m", concurrency=(1, 4), prompts_file=DEFAULT_WORKLOAD, out_dir=tmp_path / "out",
                              device="cpu", num_prompts=4)
    with pytest.raises(KeyboardInterrupt):
        run_peer_sweep(settings, progress=False)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["interrupted"] and [level["concurrency"] for level in results["levels"]] == [1]
    assert "**Interrupted**" in (tmp_path / "out" / "report.md").read_text()
    assert peers[0].stopped


def test_a_peer_record_keeps_the_answers_text_and_prompt_length_as_a_servers_does():
    """results.json is bench-serve's shape, whose records keep each answer's text (bench-ceiling
    reads it) and prompt length: the peer's had "" and None."""
    from tandem.bench.peers.transformers_cb import output_record
    from tandem.bench.serve.requests import warmup_request

    output = SimpleNamespace(error=None, generated_tokens=[72, 105, 2, 9], timestamps=[1.0, 1.1, 1.2, 1.3])
    record, kept = output_record(warmup_request(), output, 0.5, 1.4, frozenset({2}), 16, prompt_tokens=21,
                                 decode=lambda ids: bytes(ids).decode())
    assert kept == (72, 105) and record.text == "Hi" and record.prompt_tokens == 21
    assert record.completion_tokens == 2 and record.finish_reason == "stop"
