"""The `tandem` CLI on real models: JSON output, stops, and one clear error for bad input."""

import json
import shutil
import subprocess
import sys

import pytest

SMALL = "smollm2-135m-instruct"
BASE = ["generate", "--target", SMALL, "--draft", SMALL, "--threads", "2"]


def tandem(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def test_generate_json_output():
    result = tandem(*BASE, "--prompt", "The three primary colours are", "--max-tokens", "16", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # stdout holds the JSON alone; what it is doing goes to stderr
    assert f"loading {SMALL} and {SMALL}" in result.stderr
    assert data["text"] and len(data["token_ids"]) == data["stats"]["new_tokens"] <= 16
    for key in ("new_tokens", "seconds", "tokens_per_s", "acceptance_rate", "mean_accepted_len",
                "target_forwards", "draft_forwards"):
        assert key in data["stats"]
    assert data["stats"]["seconds"] > 0
    assert data["finish_reason"] == ("length" if data["stats"]["new_tokens"] == 16 else "stop")


def test_stop_string_cuts_output():
    result = tandem(*BASE, "--messages", '[{"role": "user", "content": "Count from 1 to 20, one number per line."}]',
                    "--max-tokens", "60", "--stop", "5", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "5" not in data["text"] and "4" in data["text"] and data["finish_reason"] == "stop"


def test_bench_step_times_the_llamacpp_runner_beside_one_call(tmp_path):
    out = tmp_path / "step.json"
    result = tandem("bench-step", "--backend", "llamacpp", "--model", SMALL, "--batches", "2",
                    "--tokens", "1,40", "--context", "16", "--repeats", "1", "--threads", "2",
                    "--serial", "--out", str(out))
    assert result.returncode == 0, result.stderr
    timings = json.loads(out.read_text())["timings"]
    assert [(t["runner"], t["batch"], t["tokens_per_slot"]) for t in timings] == [
        ("llamacpp", 2, 1), ("one-call", 2, 1), ("llamacpp", 2, 40), ("one-call", 2, 40)]
    assert all(t["step_ms"] > 0 for t in timings)


def test_bench_step_on_llamacpp_refuses_slots_its_pool_cannot_hold_before_timing():
    """The check read the pool's size through a wrapper that lacked it: 2 slots of 2,100 tokens ran
    23 s into 'llama.cpp decode failed', 64 of 4,000 for minutes."""
    result = tandem("bench-step", "--backend", "llamacpp", "--model", SMALL, "--batches", "64", "--tokens", "64",
                    "--context", "4000", "--repeats", "1", "--threads", "2", timeout=120)
    assert result.returncode == 2 and "KV cells; the llamacpp runner's pool holds" in result.stderr, result.stderr
    assert "steps" not in result.stderr  # refused before the timing started


@pytest.fixture(scope="module")
def mismatched_folder(tmp_path_factory, small_hf):
    """An HF folder whose tokenizer maps two tokens to swapped ids."""
    folder = tmp_path_factory.mktemp("mismatched")
    for item in __import__("pathlib").Path(small_hf).iterdir():
        shutil.copy(item, folder / item.name)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = list(vocab)[100], list(vocab)[101]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return str(folder)


@pytest.fixture(scope="module")
def corrupt_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("corrupt") / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 4096)
    return str(path)


BAD_INPUTS = {
    "empty prompt": ["--prompt", ""],
    "empty messages": ["--messages", "[]"],
    "bad messages json": ["--messages", "{not json"],
    "prompt beyond context": ["--prompt", "hello " * 5000],
    "k negative": ["--prompt", "hi", "--k", "-1"],
    "k not a number": ["--prompt", "hi", "--k", "lots"],
    "negative temperature": ["--prompt", "hi", "--temperature", "-0.5"],
    "top-p below zero": ["--prompt", "hi", "--top-p", "-0.1"],
    "top-p above one": ["--prompt", "hi", "--top-p", "1.5"],
    "max tokens zero": ["--prompt", "hi", "--max-tokens", "0"],
    "answer beyond context": ["--prompt", "hi", "--max-tokens", "100000"],
    "unknown drafter": ["--prompt", "hi", "--drafter", "oracle"],
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_clear_error(case):
    result = tandem(*BASE, *BAD_INPUTS[case])
    assert result.returncode == 2, (case, result.stdout, result.stderr)
    said = [line for line in result.stderr.splitlines() if not line.startswith("loading ")]  # beside the load note
    assert len(said) == 1 and said[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr


def test_unknown_model():
    result = tandem("generate", "--target", "no-such-model", "--drafter", "none", "--prompt", "hi")
    assert result.returncode == 2 and "no-such-model" in result.stderr and "Traceback" not in result.stderr


def test_mismatched_tokenizers(mismatched_folder):
    result = tandem("generate", "--target", SMALL, "--draft", mismatched_folder, "--draft-backend", "torch",
                    "--drafter", "model", "--prompt", "hi")
    assert result.returncode == 2 and "tokenizer" in result.stderr and "Traceback" not in result.stderr


def test_corrupt_gguf(corrupt_gguf):
    result = tandem("generate", "--target", corrupt_gguf, "--drafter", "none", "--prompt", "hi")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def test_a_context_the_model_cannot_hold_is_not_asked_for_again():
    """--context-length beyond what the model was trained on is capped there: the advice was to
    raise --context-length, which cannot help."""
    result = tandem("generate", "--target", SMALL, "--drafter", "none", "--prompt", "x", "--threads", "2",
                    "--context-length", "10000000", "--max-tokens", "9000")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "the model holds no more" in result.stderr and "raise --context-length" not in result.stderr
