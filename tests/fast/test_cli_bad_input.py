"""Bad input to every command that can be refused before a model loads or long work starts: one
`error:` line and exit 2, never a traceback, a silent default or a failure after the work."""

import json
import os
import sys
from pathlib import Path

import pytest

from tandem.cli.main import main

CLUSTER = str(Path(__file__).parents[2] / "examples" / "clusters" / "hetero-64.yaml")
MIXED = str(Path(__file__).parents[2] / "examples" / "clusters" / "mixed-replicas.yaml")  # no draft model
TOO_MANY_THREADS = str((os.cpu_count() or 1) + 1)


def exit_code(argv: list[str]) -> int:
    """main()'s exit status, argparse's usage errors included (they raise SystemExit)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@pytest.fixture
def files(tmp_path):
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    control = tmp_path / "control.yaml"
    control.write_text("workers:\x07\n")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    text = tmp_path / "text.json"
    text.write_text(json.dumps({"throughput_tok_s": "fast", "latency_ms_p50": 3}))
    level = {"concurrency": 1, "configs": {"tandem-spec": {"request_records": [{"id": "a", "ok": True, "text": "x"}]}}}
    results = {"settings": {"target": "smollm2-135m-instruct", "prompts_file": str(tmp_path / "gone.jsonl")},
               "levels": [level]}
    (tmp_path / "no_prompts.json").write_text(json.dumps(results))
    (tmp_path / "no_configs.json").write_text(json.dumps(results | {"levels": [level | {"configs": {}}]}))
    base = Path(MIXED).read_text()
    clusters = {"nan_slowdown": base.replace("slowdown: 3.0", "slowdown: .nan"),
                "huge_replicas": base.replace("threads: 1\n    slowdown", "threads: 1\n    replicas: 99999999999999999999\n    slowdown"),
                "merge_key": base.replace("  - name: slow\n", "  - &slow\n    name: slow\n", 1) + "  - <<: *slow\n    name: slower\n",
                "exponent": base.replace("threads: 1\n    slowdown", "threads: 1e9\n    slowdown"),
                "file_drafter_model": "drafter: model\n" + base,
                "wrong_model": base.replace("smollm2-135m-instruct", "smollm2-135m-instrukt"),
                "unknown_hardware": "workers:\n  - name: g\n    role: verify\n    model: smollm2-135m-instruct\n"
                                    "    backend: torch\n    device: cuda\n    dtype: bf16\n    hardware: a100\n"}
    for name, content in clusters.items():
        (tmp_path / f"{name}.yaml").write_text(content)
    return {"binary": str(binary), "control": str(control), "list": str(listed), "text": str(text),
            "no_prompts": str(tmp_path / "no_prompts.json"), "no_configs": str(tmp_path / "no_configs.json"),
            "not_a_folder": "/etc/passwd/out", "tmp": str(tmp_path),
            **{name: str(tmp_path / f"{name}.yaml") for name in clusters}}


CASES = [  # argv (with {file} names), what the one error line says
    (["generate", "--prompt", "hi", "--context-length", "10"], "at least 64"),
    (["simulate", "--scaling", CLUSTER, "--out", "{tmp}", "--sizes", "1,x"], "wants whole numbers"),
    (["simulate", "--cluster", CLUSTER, "--prompt-tokens", "-5"], "at least 1"),
    (["simulate", "--cluster", CLUSTER, "--concurrency", "0"], "at least 1"),
    (["simulate", "--cluster", CLUSTER, "--acceptance", "1.5"], "below 1"),
    (["simulate", "--cluster", CLUSTER, "--acceptance", "1"], "below 1"),  # said "at most 1", then refused 1
    (["simulate", "--cluster", CLUSTER, "--sizes", "2"], "only with --scaling"),
    (["simulate", "--scaling", CLUSTER, "--out", "{tmp}", "--measured", "{list}"], "only with --cluster"),
    (["simulate", "--scaling", CLUSTER, "--out", "{tmp}", "--rate", "3"], "--rate: applies only with --cluster"),
    (["simulate", "--scaling", CLUSTER, "--out", "{tmp}", "--k", "5", "--roles", "as-written"],
     "--k, --roles as-written: apply only with --cluster"),  # the sweep ran as if they were not given
    (["simulate", "--cluster", CLUSTER, "--seed", "-1"], "at least 0"),  # a numpy traceback
    (["generate", "--prompt", "x", "--threads", "10000"], "CPUs"),  # 10,001 threads, silent for minutes
    (["bench-serve", "--threads", TOO_MANY_THREADS, "--out", "{tmp}"], "CPUs"),
    (["bench-step", "--threads", TOO_MANY_THREADS], "CPUs"),
    (["bench-step", "--batches", "1,100000"], "from 1 to 256"),  # ran 288 s into a full KV pool
    (["bench-ceiling", "{list}", "--max-draft", "1000"], "from 1 to 63"),  # priced rounds past the curve
    (["generate", "--backend", "llamacp", "--prompt", "x"], "llamacpp, torch, auto"),
    (["profile", "--threads", TOO_MANY_THREADS], "CPUs"),
    (["simulate", "--cluster", CLUSTER, "--measured", "{list}"], "JSON object"),
    (["simulate", "--cluster", CLUSTER, "--measured", "{text}"], "must be numbers"),
    (["simulate", "--cluster", CLUSTER, "--measured", "{binary}"], "cannot read the measured run"),
    (["simulate", "--cluster", CLUSTER, "--measured", "{tmp}/nope.json"],
     "nope.json: No such file or directory"),  # said Python's "[Errno 2] ... 'nope.json'"
    (["simulate", "--scaling", CLUSTER, "--out", "{tmp}", "--json"], "--json applies only with --cluster"),  # ignored
    (["serve", "--model", "smollm2-135m-instruct"], "the model is --target here"),  # vLLM's name: no hint
    (["models", "rm", "{tmp}/nope.gguf"], "no such model file"),  # "neither ... nor a .gguf file"
    (["simulate", "--cluster", CLUSTER, "--prompt-tokens", "100000", "--out", "{tmp}/never"],
     "--prompt-tokens 100000: 100128 tokens a sequence, more than the"),  # priced as a latency
    (["simulate", "--scaling", CLUSTER, "--max-tokens", "100000", "--out", "{tmp}/never"], "more than the"),
    (["simulate", "--scaling", CLUSTER, "--out", "{tmp}/never", "--sizes", "1,100000000"],
     "--sizes 100000000: the cluster at that size"),  # named an inner replica count, after the smaller sizes ran
    (["simulate", "--cluster", CLUSTER, "--out", "{not_a_folder}"], "cannot create the output folder"),
    (["plan", "--cluster", "{binary}"], "not UTF-8"),
    (["plan", "--cluster", "{control}"], "is not allowed"),
    (["plan", "--cluster", CLUSTER, "--k", "100"], "from 0 to 64"),
    (["plan", "--cluster", CLUSTER, "--latency-target-ms", "nan"], "finite number above 0"),
    (["plan", "--cluster", CLUSTER, "--acceptance", "model=nan"], "rates from 0 to below 1"),
    (["plan", "--cluster", CLUSTER, "--acceptance", "model=1"], "rates from 0 to below 1"),
    (["simulate", "--cluster", CLUSTER, "--rate", "nan"], "finite number"),  # it simulated for ever
    (["simulate", "--cluster", CLUSTER, "--prompt-tokens", "50", "--shared-prefix-tokens", "50"],
     "must be below --prompt-tokens 50"),  # it simulated, slower than with no sharing
    (["simulate", "--cluster", CLUSTER, "--rate", "inf"], "finite number"),
    (["simulate", "--cluster", CLUSTER, "--step-overhead-ms", "nan"], "finite number"),  # printed nan latencies
    (["generate", "--prompt", "hi", "--seed", "-2"], "seed must be"),  # numpy's traceback, after loading
    (["plan", "--cluster", CLUSTER, "--drafter", "none", "--k", "5"], "drafts nothing"),
    (["plan", "--cluster", MIXED, "--drafter", "model"], "needs a draft model"),  # exit 0 and "drafter model, k=1"
    (["plan", "--cluster", "{file_drafter_model}"], "needs a draft model"),  # the file's drafter: the same plan
    (["plan", "--cluster", "{wrong_model}"], "wrong_model.yaml:7: workers[0].model: worker 'fast'"),  # no file:line
    (["plan", "--cluster", "{unknown_hardware}"],  # a note naming a profile that was not there, then no file:line
     "unknown_hardware.yaml:8: workers[0].hardware: worker 'g': hardware 'a100' is neither a known device class"),
    (["plan", "--cluster", "{nan_slowdown}"], "must be a finite number"),  # the planner's ValueError traceback
    (["simulate", "--cluster", "{nan_slowdown}"], "must be a finite number"),
    (["simulate", "--cluster", "{nan_slowdown}", "--out", "{tmp}/never"], "must be a finite number"),  # left the folder
    (["simulate", "--scaling", "{control}", "--out", "{tmp}/never"], "control"),
    (["plan", "--cluster", "{huge_replicas}"], "must be <= 4096"),  # the planner's OverflowError traceback
    (["plan", "--cluster", "{merge_key}"], "merge keys"),  # PyYAML's ConstructorError traceback
    (["plan", "--cluster", "{exponent}"], "YAML reads it as text"),
    (["serve", "--cluster", MIXED, "--target", "x", "--context-length", "128"],
     "--target, --context-length describe one engine's models"),  # served the file's model, 4096 context
    (["serve", "--cluster", MIXED, "--target", "qwen2.5-coder-1.5b-instruct"],
     "--target describes one engine's models"),  # the default's name given: served the file's model, no word
    (["serve", "--cluster", MIXED, "--dtype", "fp32"], "--dtype describes"),
    (["profile", "--cluster", CLUSTER, "--threads", "1"], "--threads: applies only with --model"),  # ignored: 2 threads
    (["profile", "--cluster", CLUSTER, "--backend", "llamacpp", "--dtype", "fp32"], "--backend, --dtype: apply only"),
    (["serve", "--cluster", MIXED, "--cache-disk", "1G"], "replicas have no disk tier"),  # it said: give --cache-dir
    (["serve", "--cluster", MIXED, "--draft-ahead"], "drafter 'ngram' drafts in the replica"),  # did nothing
    (["bench-cluster", "--cluster", MIXED, "--configs", "cluster,cluster+draft-ahead", "--drafter", "ngram",
      "--out", "{tmp}"], "drafter 'ngram' drafts in the replica"),  # reported a row that drafted nothing ahead
    (["bench-ceiling", "{list}"], "not a bench-serve results.json"),
    (["bench-ceiling", "{binary}"], "cannot read"),
    (["bench-ceiling", "{no_configs}"], "no concurrency or no configs"),  # StopIteration's traceback
    (["bench-ceiling", "{no_prompts}"], "gone.jsonl"),  # found only after measuring the curves
    (["bench-ceiling", "{no_prompts}", "--reference", "nosuch"], "no config 'nosuch'"),
    (["bench-ceiling", "{list}", "--max-draft", "0"], "from 1 to 63"),
    (["bench-ceiling", "{list}", "--out", "{not_a_folder}"], "cannot create the output folder"),
    (["bench-step", "--repeats", "0"], "at least 1"),
    (["bench-step", "--out", "{tmp}"], "is a folder"),
    (["profile", "--model", "m", "--out", "{not_a_folder}"], "cannot create the output folder"),
    (["profile", "--model", "m", "--force"], "with --model a profile is always measured"),
    (["profile", "--model", "m", "--dtype", "bf16"], "llama.cpp reads the GGUF file's own precision"),  # ignored
    (["bench-step", "--backend", "llamacpp", "--dtype", "fp16"], "--dtype fp16 is for the torch runner"),
    (["serve", "--max-running", "65"], "at most 64 sequences together"),  # was said after the models loaded
    (["bench-cluster", "--cluster", CLUSTER, "--configs", "single,single"], "more than once"),
    (["bench-cluster", "--cluster", CLUSTER, "--configs", ""], "no config named"),
    (["bench-cluster", "--cluster", CLUSTER, "--out", "{not_a_folder}"], "cannot create the output folder"),
    (["soak", "--serve-args", '"unbalanced', "--duration", "1m", "--sample-every", "10s"], "--serve-args"),
    (["generate", "--prompt", "hi", "--backend", "llamacpp", "--dtype", "bf16", "--kv-memory", "1G"],
     "--dtype bf16 and --kv-memory apply to the torch backend only"),
    # the draft's placement in its own option names (they said --backend and --device, the target's)
    (["generate", "--prompt", "hi", "--draft-device", "cuda"],
     "the draft model: the llamacpp backend runs on the cpu here, not 'cuda': use --draft-backend torch"),
    (["generate", "--prompt", "hi", "--draft-backend", "torch", "--draft-device", "cuda:0"], "use --draft-device cpu"),
    (["generate", "--prompt", "hi", "--backend", "torch", "--torch-runner", "serial", "--kv-memory", "1G"],
     "--torch-runner serial keeps a cache per sequence that it does not bound"),  # it was silently ignored
    (["generate", "--prompt", "hi", "--draft-backend", "llamacpp", "--draft-dtype", "bf16"],
     "--draft-dtype bf16 applies to the torch backend only, and llama.cpp runs the draft (--draft-backend llamacpp)"),
    (["bench-serve", "--prompts", "multiturn", "--num-prompts", "1", "--concurrency", "2"],
     "--num-prompts and --concurrency do not apply"),
    (["generate", "--prompt", "hi", "--top-k", "-2"], "argument --top-k: wants a number of at least -1"),
    (["generate", "--prompt", "hi", "--step-tokens", "0"], "argument --step-tokens: wants a number of at least 1"),
    (["generate", "--prompt", "hi", "--k", "-1"], "argument --k: must be 'auto' or an integer from 0 to 64, got -1 "),
    (["soak", "--duration", "1m"], "no second sample"),
    (["soak", "--url", "http://127.0.0.1:9/v1", "--target", "smollm2-135m-instruct", "--duration", "1m",
      "--sample-every", "10s"], "--target starts a server here"),
    (["soak", "--duration", "1m", "--sample-every", "10s", "--warmup", "2h"], "nothing of --duration"),
    (["soak", "--duration", "1m", "--sample-every", "10s", "--prompts", "{binary}"], "cannot read the prompts file"),
    (["soak", "--duration", "1m", "--sample-every", "10s", "--out", "{not_a_folder}"], "cannot create the output folder"),
    (["bench-serve", "--prompts", "multiturn", "--num-prompts", "1"], "--num-prompts does not apply to --prompts multiturn"),
    (["bench-serve", "--prompts", "multiturn", "--concurrency", "1,2,4,8,16"], "--concurrency does not apply to --prompts multiturn"),
    (["bench-serve", "--backend", "torch", "--dtype", "fp64"], "--dtype must be one of"),  # after loading, before
    (["serve", "--cache-dir", "{not_a_folder}"], "cannot create the folder"),
    (["generate", "--prompt", ""], "--prompt is empty"),
    (["generate", "--messages", "{{}}"], "non-empty JSON list"),
    (["generate", "--messages", '[{{"role": "robot", "content": "x"}}]', "--target", "{tmp}/gone.gguf"],
     "'robot'"),  # the server refuses the role; the missing target shows the check comes before loading
    (["generate", "--prompt", "hi", "--threads", "-1"], "at least 1"),
    (["generate", "--prompt", "hi", "--max-tokens", "0"], "at least 1"),
    (["generate", "--prompt", "hi", "--max-tokens", "5000"], "--max-tokens 5000 leaves no room for a prompt"),
    (["bench", "--max-tokens", "999999", "--context-length", "128"], "leaves no room for a prompt in a context of 128"),
    (["generate", "--prompt", "hi", "--bogus"], "see tandem generate --help"),  # it named tandem --help
    (["generate", "--prompt", "hi", "--target", ""], "a model is empty"),  # read as the current folder
    (["generate", "--prompt", "hi", "--drafter", "none", "--k", "5"], "drafts nothing"),  # accepted silently
    (["models", "pull", "/models/x.gguf"], "needs no pull"),  # said paths were accepted
    (["bench", "--prompts", "{tmp}"], "is a folder"),  # said "no such prompts file"
    (["bench-serve", "--num-prompts", "0"], "at least 1"),
    (["generate", "--prompt", "hi", "--dtype", "fp64"], "unknown dtype"),  # accepted on llama.cpp
    (["generate", "--prompt", "hi", "--drafter", "ngram", "--draft-dtype", "fp8"], "--draft-dtype: unknown dtype"),
    (["bench-cluster", "--cluster", "{tmp}/gone.yaml", "--out", "{tmp}/never"], "gone.yaml"),
    (["serve", "--max-tokens", "64"], "unrecognized arguments: --max-tokens 64"),  # was --max-tokens-limit 64
    (["models", "pull", "nosuch"], "known models: "),
    (["profile", "--model", "smollm2-135m-instruct", "--contexts", "100000"], "it holds 8192"),  # after 20 s of loading
    (["bench-serve", "--target", "smollm2-135m-instruct", "--out", "{tmp}/never"],
     "tandem-spec drafts with the default draft"),  # its servers failed to start
]


@pytest.mark.parametrize("target, says", [("/dev/null", "is not a regular file"),  # "no such model file"
                                          ("{tmp}", "not a Hugging Face model folder")])  # "no tokenizer files"
def test_a_target_that_is_no_model_says_what_it_is(target, says, files, capsys):
    assert exit_code(["generate", "--prompt", "hi", "--target", target.format(**files)]) == 2
    assert says in capsys.readouterr().err


def test_pull_of_an_unknown_name_does_not_offer_paths(capsys):
    """`models pull` refuses paths, so its unknown-name error must not say a path is accepted."""
    assert exit_code(["models", "pull", "nosuch"]) == 2
    assert "also accepted" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", CASES, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(CASES)])
def test_bad_input_is_one_error_line_and_exit_2(argv, says, files, capsys):
    code = exit_code([part.format(**files) for part in argv])
    assert not Path(files["tmp"], "never").exists()  # no output folder left by a refused run
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
    assert err.startswith("error: ") and err.count("\n") == 1, err  # one line, argparse's usage errors too


def test_generate_takes_top_k_minus_one_as_off_as_the_server_does():
    from tandem.cli.main import build_parser

    assert build_parser().parse_args(["generate", "--prompt", "hi", "--top-k", "-1"]).top_k == -1  # it was refused


def test_the_context_length_reaches_both_models():
    """`--context-length` sets what target and draft hold (it was fixed at 4,096)."""
    import argparse

    from tandem.cli.options import add_model_options, draft_spec, target_spec

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    args = parser.parse_args(["--context-length", "16384"])
    assert target_spec(args).context_length == draft_spec(args).context_length == 16384
    assert target_spec(parser.parse_args([])).context_length == 4096


def test_kv_memory_takes_a_plain_number_as_mib_as_cache_ram_does():
    """`--kv-memory 1024` was 1024 bytes ("a KV budget of 0 MiB") beside `--cache-ram 1024`, 1 GiB."""
    from tandem.cli.options import kv_memory_option

    assert kv_memory_option("1024") == 2**30 and kv_memory_option("1.5G") == 3 * 2**29
    assert kv_memory_option("4096B") == 4096


def test_torch_only_options_on_an_auto_chosen_llama_cpp_are_noted(monkeypatch, capsys):
    """Without a GPU, auto runs the models on llama.cpp, where --dtype and --torch-runner do
    nothing: said in one note (they were dropped without a word), and the engine still builds."""
    import argparse

    from tandem.cli.options import add_model_options, engine_config
    from tandem.models import backends

    monkeypatch.setattr(backends, "_gpu_device", lambda: None)
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    config = engine_config(parser.parse_args(["--dtype", "bf16", "--torch-runner", "serial"]))
    assert config.target.dtype == "bf16"
    err = capsys.readouterr().err
    assert "note: --dtype bf16 and --torch-runner serial apply to the torch backend only" in err, err
    engine_config(parser.parse_args([]))
    assert "note:" not in capsys.readouterr().err
    # the side an option belongs to decides: a draft option with only the target named is a note
    # (it was refused, and the message named --backend for an option --backend does not govern)
    engine_config(parser.parse_args(["--backend", "llamacpp", "--draft-dtype", "bf16"]))
    assert "note: --draft-dtype bf16 applies to the torch backend only" in capsys.readouterr().err
    # no draft model (a drafter that needs none): its options act on nothing, neither noted as
    # llama.cpp's nor refused (they said the models ran on llama.cpp beside a torch target)
    engine_config(parser.parse_args(["--backend", "torch", "--drafter", "ngram", "--draft-dtype", "bf16"]))
    engine_config(parser.parse_args(["--backend", "torch", "--drafter", "none", "--draft-backend", "llamacpp",
                                     "--draft-dtype", "bf16"]))
    assert capsys.readouterr().err == ""


def test_sigterm_stops_a_command_as_ctrl_c_does(monkeypatch):
    """`timeout` or `kill` sends SIGTERM: the command ends through the same path as Ctrl-C
    (servers a bench started are stopped on the way out; the default action left a peer server
    running), exit 130, and the handler before it is back afterwards."""
    import argparse
    import os
    import signal
    import time

    import threading

    from tandem.cli import main as main_module

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are the main thread's")

    def sleeps_until_killed(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.set_defaults(func=sleeps_until_killed)
    monkeypatch.setattr(main_module, "build_parser", lambda: parser)
    before = signal.getsignal(signal.SIGTERM)
    started = time.monotonic()
    assert main_module.main(["sleep"]) == 130 and time.monotonic() - started < 4
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_unusable_tandem_home_is_one_error_line(tmp_path, monkeypatch, capsys):
    """$TANDEM_HOME a file: a pull ended in NotADirectoryError's traceback, and a list showed
    every model unpulled as if they were gone; now one line naming the variable, before any
    download."""
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setenv("TANDEM_HOME", str(home))
    for argv in (["models", "pull", "smollm2-135m-instruct"], ["models", "list"]):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: $TANDEM_HOME") and "is a file, not a folder" in err and err.count("\n") == 1


def test_a_torch_device_this_machine_lacks_is_one_error_line(monkeypatch):
    """--device cuda:0 on a CPU-only torch ended in torch's AssertionError after loading."""
    import torch

    from tandem.errors import TandemError
    from tandem.models.torch_runner import torch_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:0", "mps"):
        with pytest.raises(TandemError, match="not available here"):
            torch_device(name)
    assert torch_device("cpu").type == "cpu"
    with pytest.raises(TandemError, match="unknown torch device"):
        torch_device("gpu9")


def test_a_catalog_target_of_another_family_drafts_without_the_default_draft(capsys):
    """SmolLM2 with the defaults failed on the Qwen draft's tokenizer, though --help promised
    ngram where there is no draft model: the default is now ngram there, said on stderr."""
    import argparse

    from tandem.cli.options import add_model_options, engine_config

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    config = engine_config(parser.parse_args(["--target", "smollm2-135m-instruct"]))
    assert config.drafter == "ngram" and config.draft is None
    assert "drafter: ngram (the default draft" in capsys.readouterr().err
    for argv in ([], ["--target", "smollm2-135m-instruct", "--draft", "smollm2-135m-instruct"]):
        assert engine_config(parser.parse_args(argv)).drafter == "hybrid"  # the default pair; a draft named
    named = engine_config(parser.parse_args(["--target", "smollm2-135m-instruct", "--drafter", "ngram"]))
    assert named.drafter == "ngram" and named.draft is None  # named: never changed
    assert capsys.readouterr().err == ""


def test_generate_json_interrupted_prints_what_was_generated(monkeypatch, capsys):
    """Ctrl-C during `generate --json` printed nothing: everything generated was lost."""
    from types import SimpleNamespace

    from tandem.cli import generate_cmd

    class Interrupted:
        def __init__(self, config):
            pass

        def prompt_ids(self, prompt, messages):
            return [1, 2]

        def request(self, *args):
            return None

        def stream_text(self, request, stats):
            yield "Hello", [7]
            yield ",", [8]
            raise KeyboardInterrupt

    monkeypatch.setattr(generate_cmd, "engine_config", lambda args: SimpleNamespace(loading_note="loading"))
    monkeypatch.setattr(generate_cmd, "TextGenerator", Interrupted)
    assert main(["generate", "--prompt", "hi", "--json"]) == 130
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"text": "Hello,", "token_ids": [7, 8], "interrupted": True}


def test_generate_caps_its_default_answer_by_the_context_and_says_what_would_fit():
    """`--context-length 128` without --max-tokens was an error (the default 128 did not fit beside
    the prompt), and a prompt longer than the context was told to lower --max-tokens."""
    from types import SimpleNamespace

    from tandem.errors import TandemError
    from tandem.speculation.sampling import SamplingParams
    from tandem.text.text_generator import TextGenerator

    generator = object.__new__(TextGenerator)
    generator.engine = SimpleNamespace(context_length=128)
    generator.config = SimpleNamespace(target=SimpleNamespace(context_length=128))
    generator.tokenizer = SimpleNamespace(stop_token_ids=frozenset(), decode=lambda ids: "")
    greedy = SamplingParams()
    assert generator.request((1,) * 20, None, greedy).max_tokens == 108  # capped, not refused
    assert generator.request((1,) * 20, 50, greedy).max_tokens == 50
    with pytest.raises(TandemError, match="--max-tokens 200 exceed the context of 128 tokens: lower --max-tokens "
                                          "to 108 or shorten the prompt, or raise --context-length"):
        generator.request((1,) * 20, 200, greedy)
    with pytest.raises(TandemError, match="a 600-token prompt leaves no room for an answer in the context of 128 "
                                          "tokens: shorten the prompt or raise --context-length"):
        generator.request((1,) * 600, None, greedy)


def test_a_local_target_whose_tokenizer_the_default_draft_cannot_share_drafts_without_a_model(
        monkeypatch, capsys, tmp_path):
    """A local SmolLM2 file with the default drafter pulled the Qwen draft (~900 MiB, re-quantized)
    to be refused for its tokenizer; offline, the pull's error said nothing of --drafter."""
    import argparse
    from types import SimpleNamespace

    from tandem.cli.options import add_model_options, engine_config
    from tandem.errors import TandemError
    from tandem.models import backends, resolve
    from tandem.text import tokenizer

    monkeypatch.setattr(backends, "_gpu_device", lambda: None)
    monkeypatch.setattr(resolve, "tokenizer_path", lambda model: f"/tokenizers/{model}")
    sizes = {"/tokenizers/smol.gguf": 49152, "/tokenizers/qwen.gguf": 151936}
    monkeypatch.setattr(tokenizer, "TextTokenizer",
                        lambda path: SimpleNamespace(vocabulary=lambda: dict.fromkeys(range(sizes[path]))))
    monkeypatch.chdir(tmp_path)
    for name in ("smol.gguf", "qwen.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    assert engine_config(parser.parse_args(["--target", "smol.gguf"])).drafter == "ngram"
    assert ("drafter: ngram (the default draft qwen2.5-coder-0.5b-instruct-q4_0 is a Qwen2.5-Coder model, whose "
            "tokenizer has 151936 entries against the target's 49152" in capsys.readouterr().err)
    assert engine_config(parser.parse_args(["--target", "qwen.gguf"])).drafter == "hybrid"
    with pytest.raises(TandemError, match="--drafter model drafts with the default draft .* whose tokenizer has "
                                          "151936 entries against the target's 49152: give --draft"):
        engine_config(parser.parse_args(["--target", "smol.gguf", "--drafter", "model"]))


def test_a_drafter_named_with_a_model_is_refused_before_the_default_draft_of_another_family_is_pulled(
        tmp_path, monkeypatch, capsys):
    """`generate --target smollm2-135m-instruct --drafter model` (or hybrid) pulled the default Qwen
    draft (469 MiB), re-quantized it, and only then refused its tokenizer; `bench` on the same
    target did so for its model and hybrid configs. Now one line, nothing pulled; a --draft
    named keeps its path (its tokenizer is checked at load)."""
    import argparse

    from tandem.cli.options import add_model_options, engine_config
    from tandem.models import resolve

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(resolve, "pull", refuse_to_pull)
    target = ["--target", "smollm2-135m-instruct"]
    for argv in (["generate", "--prompt", "hi", *target, "--drafter", "model"],
                 ["generate", "--prompt", "hi", *target, "--drafter", "hybrid", "--threads", "1"],
                 ["serve", *target, "--drafter", "hybrid"],
                 ["bench", *target, "--configs", "none,hybrid:k=4", "--out", str(tmp_path / "never")]):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert "with the default draft qwen2.5-coder-0.5b-instruct-q4_0, a Qwen2.5-Coder model, with another " \
               "tokenizer than smollm2-135m-instruct's: give --draft a draft model of the target's family" in err, err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "or --drafter ngram, which needs no model" in exit_and_err(["generate", "--prompt", "hi", *target,
                                                                      "--drafter", "model"], capsys)
    assert not (tmp_path / "home" / "models").exists() and not (tmp_path / "never").exists()
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    named = engine_config(parser.parse_args([*target, "--drafter", "model", "--draft", "smollm2-135m-instruct"]))
    assert named.drafter == "model" and named.draft.model == "smollm2-135m-instruct"


def test_a_typo_in_either_model_is_said_before_anything_is_pulled(tmp_path, monkeypatch, capsys):
    """`--draft smollm-135m-instruct` was refused only after the target was pulled (1 GiB for the
    default one): both names are checked first, by the CLI and by build_engine."""
    from tandem.engine.build import EngineConfig, build_engine
    from tandem.errors import ModelNotFoundError
    from tandem.models import resolve
    from tandem.models.backends import RunnerSpec

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(resolve, "pull", refuse_to_pull)
    for argv, says in [(["generate", "--prompt", "hi", "--draft", "smollm-135m-instruct"],
                        "unknown model 'smollm-135m-instruct' (did you mean 'smollm2-135m-instruct'?)"),
                       (["generate", "--prompt", "hi", "--draft", str(tmp_path / "gone.gguf")], "no such model file"),
                       (["serve", "--draft", "qwen2.5-coder-0.5b"], "unknown model 'qwen2.5-coder-0.5b'"),
                       (["bench", "--draft", "smollm-135m-instruct", "--out", str(tmp_path / "never")],
                        "unknown model 'smollm-135m-instruct'")]:
        err = exit_and_err(argv, capsys)
        assert says in err and err.startswith("error: ") and err.count("\n") == 1, err
    config = EngineConfig(RunnerSpec("qwen2.5-coder-1.5b-instruct"), RunnerSpec("smollm-135m-instruct"), "model")
    with pytest.raises(ModelNotFoundError, match="did you mean 'smollm2-135m-instruct'"):
        build_engine(config, max_running=1)
    assert not (tmp_path / "home" / "models").exists()


def refuse_to_pull(name, progress=True):
    raise AssertionError(f"{name} was pulled")


def exit_and_err(argv: list[str], capsys) -> str:
    """What a refused command said on stderr (exit status 2)."""
    code = exit_code(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    return err


def test_generate_takes_seed_minus_one_as_none_as_the_server_does():
    import argparse

    from tandem.cli.generate_cmd import sampling_of

    def options(seed):
        return argparse.Namespace(temperature=0.7, top_k=-1, top_p=0.9, seed=seed)

    assert sampling_of(options(-1)).seed is None  # it was refused: "seed must be ..."
    assert sampling_of(options(7)).seed == 7
    assert sampling_of(options(None)).seed is None


def test_generate_reads_messages_whose_content_is_text_parts():
    from tandem.cli.generate_cmd import _parse_messages

    raw = json.dumps([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert _parse_messages(raw) == [{"role": "user", "content": "a\nb"}]  # refused before


def test_a_read_only_or_full_folder_is_one_error_line_wherever_it_strikes(monkeypatch, tmp_path, capsys):
    """A read-only home missing a derived file (the tokenizer converted at first use) ended in a
    raw PermissionError traceback; other OS errors still propagate (they are bugs)."""
    import errno

    from tandem.cli import generate_cmd

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))

    def read_only(args):
        raise PermissionError(errno.EROFS, "Read-only file system", str(tmp_path / "m" / ".tokenizer.tmp"))

    monkeypatch.setattr(generate_cmd, "run", read_only)
    assert main(["generate", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Read-only file system: ") and f"now {tmp_path}" in err and err.count("\n") == 1

    def broken(args):
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setattr(generate_cmd, "run", broken)
    with pytest.raises(ConnectionRefusedError):
        main(["generate", "--prompt", "hi"])


def test_ctrl_c_while_the_commands_load_is_one_line_not_a_traceback(monkeypatch, capsys):
    from tandem.cli import main as main_module

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(main_module, "build_parser", interrupted)
    assert main(["models", "list"]) == 130
    assert capsys.readouterr().err == "\ninterrupted\n"


def test_ctrl_c_after_a_command_said_what_it_kept_is_not_said_twice(monkeypatch, capsys):
    """bench-serve, bench-peer and soak said "interrupted: wrote the finished levels ...", then
    the CLI a bare "interrupted" under it."""
    from tandem.cli import soak_cmd
    from tandem.errors import InterruptSaid

    def said(args):
        print("interrupted: wrote the 3 samples so far to out", file=sys.stderr)
        raise InterruptSaid()

    monkeypatch.setattr(soak_cmd, "run", said)
    assert main(["soak", "--url", "http://127.0.0.1:9"]) == 130
    assert capsys.readouterr().err == "interrupted: wrote the 3 samples so far to out\n"


def test_a_refused_file_outside_the_home_is_not_blamed_on_tandem_home(monkeypatch, tmp_path):
    import errno

    from tandem.cli.main import folder_error

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    own = folder_error(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "home" / "profiles" / "x")))
    theirs = folder_error(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "prompts.jsonl")))
    assert "$TANDEM_HOME" in own and theirs == f"Permission denied: {tmp_path / 'prompts.jsonl'}"
    full = folder_error(OSError(errno.ENOSPC, "No space left on device"))  # a write's: no file named
    assert full.startswith("No space left on device while writing an output (--out) or under $TANDEM_HOME")


def test_an_atomic_write_on_a_full_disk_leaves_no_temp_file_and_names_its_file(tmp_path, monkeypatch):
    """A full disk left the local model's source marker empty, which later runs trusted."""
    import errno
    import pathlib

    from tandem.paths import write_text_atomic

    def full(self, text):
        self.open("w").close()  # the temp file is made, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(OSError) as error:
        write_text_atomic(tmp_path / "source", "x")
    assert error.value.filename == str(tmp_path / "source") and list(tmp_path.iterdir()) == []


def test_size_options_name_themselves(capsys):
    """'error: a memory size must be 0 or more, got -5' named no option."""
    from tandem.cli.serve_cmd import _size
    from tandem.errors import TandemError

    for option in ("--cache-ram", "--cache-disk"):
        with pytest.raises(TandemError, match=f"^{option}: a memory size must be 0 or more"):
            _size(option, "-5")
    assert _size("--cache-ram", "2G") == 2 << 30 and _size("--cache-disk", None) is None


def test_a_damaged_saved_profile_is_measured_again(monkeypatch, tmp_path, capsys):
    """`plan` refused a profile cut short ("not valid JSON"), while `profile --cluster` said
    "nothing to profile": it only checked that the file existed."""
    from tandem.cli.profile_cmd import _cluster_specs
    from tandem.cluster.profiles.profile_store import default_profile_path

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    cluster = tmp_path / "one.yaml"
    cluster.write_text("workers:\n  - name: v\n    role: verify\n    model: smollm2-135m-instruct\n"
                       "    backend: llamacpp\n    device: cpu\n    threads: 1\n")
    saved = default_profile_path("smollm2-135m-instruct", "llamacpp", "cpu", "fp32", 1)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text('{"curves": {"1": [[1, 10.0')  # cut short
    assert len(_cluster_specs(str(cluster), force=False)) == 1
    assert "is not valid JSON" in capsys.readouterr().err
    saved.write_bytes(b"\xff\xfe edited in another encoding")  # a UnicodeDecodeError was a traceback
    assert len(_cluster_specs(str(cluster), force=False)) == 1 and "is not valid JSON" in capsys.readouterr().err


def test_a_closed_stdout_is_no_traceback():
    """`tandem generate ... >&-` raised AttributeError ('NoneType' object has no attribute 'write'):
    its answer is written with sys.stdout.write, as the command here writes after main."""
    import subprocess
    import sys

    code = ("import sys; from tandem.cli.main import main; "
            "code = main(['models', 'list']); sys.stdout.write('the answer'); sys.exit(code)")
    done = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "{code}" >&-'], stderr=subprocess.PIPE, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_a_tilde_in_tandem_home_is_the_home_folder(monkeypatch, tmp_path):
    """TANDEM_HOME='~/x' (a service's environment file) made a folder named '~' in the current one."""
    from pathlib import Path

    from tandem.paths import tandem_home

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TANDEM_HOME", "~/tandem-here")
    assert tandem_home() == tmp_path / "tandem-here"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TANDEM_HOME", "relative")
    assert tandem_home() == tmp_path / "relative" and tandem_home().is_absolute()
    monkeypatch.delenv("TANDEM_HOME")
    assert tandem_home() == Path(tmp_path) / ".cache" / "tandem"


def test_a_home_of_an_unknown_user_is_one_error_line(monkeypatch):
    """TANDEM_HOME='~nouser/x' raised RuntimeError out of expanduser: a traceback."""
    from tandem.errors import TandemError
    from tandem.paths import tandem_home

    monkeypatch.setenv("TANDEM_HOME", "~no-such-user-here/x")
    with pytest.raises(TandemError, match="no home folder is known for that user"):
        tandem_home()
