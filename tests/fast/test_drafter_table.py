"""One table of drafters (speculation/drafters/registry.py `DRAFTERS`): the engine builds exactly
its names with its model needs, and the CLI, the API, the cluster file, the planner and
`serve --cluster` all read it; nothing turns one drafter into another."""

import argparse
import typing

import pytest

from tandem.cli.options import add_model_options, engine_config
from tandem.cli.serve_cmd import cluster_engine_config
from tandem.cluster.config.cluster_spec import ACCEPTANCE_SOURCES
from tandem.cluster.config.load import load_cluster
from tandem.cluster.planning.acceptance import DEFAULT_ACCEPTANCE
from tandem.cluster.runtime.launch import ClusterOptions
from tandem.errors import TandemError
from tandem.serve.api.protocol import TandemOptions
from tandem.speculation.drafters.model import DraftModel
from tandem.speculation.drafters.registry import DRAFTER_NAMES, DRAFTERS, build_drafters, check_drafter

CLUSTER_WITHOUT_DRAFT_MODEL = """\
workers:
  - name: verify
    role: verify
    model: qwen2.5-coder-1.5b-instruct
    backend: llamacpp
    device: cpu
    threads: 1
"""


class _Model(DraftModel):
    def propose(self, *args, **kwargs):  # never called: the drafters are only built here
        raise AssertionError


def test_the_engine_builds_every_drafter_of_the_table_with_its_model_needs():
    with_model = build_drafters(_Model())
    without_model = build_drafters(None)
    assert set(with_model) == set(DRAFTER_NAMES)
    for name, spec in DRAFTERS.items():
        assert with_model[name].name == name and with_model[name].uses_model == spec.uses_model
        assert (name in without_model) == (not spec.uses_model)


def test_the_cli_the_api_the_cluster_file_and_the_planner_read_the_table():
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    help_text = next(a.help for a in parser._actions if a.dest == "drafter")
    assert help_text.startswith(" | ".join(DRAFTER_NAMES))
    assert all(f"{name}: {spec.summary}" in help_text for name, spec in DRAFTERS.items())
    with pytest.raises(TandemError, match="unknown drafter 'oracle'"):
        engine_config(parser.parse_args(["--drafter", "oracle"]))
    api_field = TandemOptions.model_fields["drafter"].annotation
    assert set(typing.get_args(typing.get_args(api_field)[0])) == set(DRAFTER_NAMES)
    drafting = {name for name, spec in DRAFTERS.items() if spec.drafts}
    assert set(ACCEPTANCE_SOURCES) == drafting == set(DEFAULT_ACCEPTANCE)


def test_the_default_drafter_is_hybrid_and_an_asked_one_is_kept():
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    assert engine_config(parser.parse_args([])).drafter == "hybrid"
    for name in DRAFTER_NAMES:
        config = engine_config(parser.parse_args(["--drafter", name]))
        assert config.drafter == name and (config.draft is not None) == DRAFTERS[name].uses_model


def test_the_default_draft_is_the_one_its_backend_runs_best_and_a_named_one_is_kept():
    from tandem.models.catalog import DEFAULT_DRAFT, SHIPPED_DRAFT

    parser = argparse.ArgumentParser()
    add_model_options(parser)
    assert engine_config(parser.parse_args(["--draft-backend", "llamacpp"])).draft.model == DEFAULT_DRAFT
    assert engine_config(parser.parse_args(["--draft-backend", "torch"])).draft.model == SHIPPED_DRAFT
    named = engine_config(parser.parse_args(["--draft-backend", "torch", "--draft", DEFAULT_DRAFT]))
    assert named.draft.model == DEFAULT_DRAFT
    auto = engine_config(parser.parse_args([])).draft  # auto: whichever backend this machine resolves
    assert auto.model == (SHIPPED_DRAFT if auto.resolved().backend == "torch" else DEFAULT_DRAFT)


def _cluster_args(tmp_path, drafter):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_WITHOUT_DRAFT_MODEL)
    return ClusterOptions(load_cluster(str(path))), argparse.Namespace(drafter=drafter, k="auto", step_tokens=512,
                                                                           prefill_floor=None, prefill_waves=False)


@pytest.mark.parametrize("drafter", ["suffix", "ngram", "none"])
def test_a_cluster_keeps_the_copy_drafter_it_was_asked_for(tmp_path, drafter):
    cluster, args = _cluster_args(tmp_path, drafter)
    assert cluster_engine_config(cluster, args).drafter == drafter


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_a_cluster_without_a_draft_model_refuses_a_model_drafter(tmp_path, drafter):
    cluster, args = _cluster_args(tmp_path, drafter)
    with pytest.raises(TandemError, match=f"drafter '{drafter}' needs a draft model: the cluster file has no worker"):
        cluster_engine_config(cluster, args)


def test_a_cluster_without_a_draft_model_defaults_to_copies_and_says_so(tmp_path, capsys):
    cluster, args = _cluster_args(tmp_path, None)
    assert cluster_engine_config(cluster, args).drafter == "ngram"
    assert "drafter: ngram" in capsys.readouterr().err


def test_an_unknown_drafter_names_the_table():
    with pytest.raises(TandemError, match="choose one of none, ngram, suffix, model, hybrid"):
        check_drafter("oracle")


def test_a_cluster_serves_the_files_drafter_and_k_as_plan_and_simulate_read_them(tmp_path, capsys):
    """serve --cluster ran its default drafter (ngram) where the file said `drafter: none, k: 0`,
    which `tandem plan` and `simulate` obeyed; --drafter and --k still win over the file."""
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER_WITHOUT_DRAFT_MODEL + "drafter: suffix\nk: 5\n")
    cluster = ClusterOptions(load_cluster(str(path)))
    args = argparse.Namespace(drafter=None, k="auto", step_tokens=512, prefill_floor=None, prefill_waves=False)
    config = cluster_engine_config(cluster, args)
    assert (config.drafter, str(config.k)) == ("suffix", "5"), config
    assert "drafter: suffix (the cluster file's" in capsys.readouterr().err
    given = cluster_engine_config(cluster, argparse.Namespace(**{**vars(args), "drafter": "none", "k": "0"}))
    assert (given.drafter, str(given.k)) == ("none", "0")


def test_a_ray_address_nobody_answers_at_is_one_error_in_seconds():
    """`--ray-address` of nothing: ray.init retried for ever with Ctrl-C held (12 minutes seen)."""
    import socket
    import time

    from tandem.cluster.runtime.launch import check_reachable

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    port = listening.getsockname()[1]
    check_reachable(f"127.0.0.1:{port}")  # a head there: fine
    listening.close()
    started = time.monotonic()
    with pytest.raises(TandemError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2)
    assert time.monotonic() - started < 5
    with pytest.raises(TandemError, match="is not HOST:PORT"):
        check_reachable("somewhere")
    check_reachable("auto")  # Ray's to resolve
