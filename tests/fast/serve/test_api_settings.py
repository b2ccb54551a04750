"""ServeSettings refuses bad values with one clear sentence; `tandem serve` turns bad options into
one `error:` line and exit 2 before loading any model."""

import pytest

from tandem.cli.main import main
from tandem.errors import TandemError
from tandem.serve.server import bind_socket, claim, default_model_name
from tandem.serve.settings import ServeSettings


def test_defaults():
    settings = ServeSettings()
    assert (settings.host, settings.port, settings.api_key) == ("127.0.0.1", 8000, None)
    assert settings.max_body_bytes == 1024 * 1024 and (settings.max_running, settings.max_waiting) == (8, 64)
    assert settings.cache_url is None and settings.grace_seconds == 10


@pytest.mark.parametrize("field,value,says", [
    ("port", 70000, "--port"), ("port", -1, "--port"), ("port", "80", "--port"), ("api_key", "  ", "--api-key"),
    ("max_body_bytes", 10, "--max-body-bytes"), ("max_running", 0, "--max-running"),
    ("max_waiting", -1, "--max-waiting"), ("cache_url", "ftp://x", "--cache must"), ("cache_ttl_seconds", 0, "--cache-ttl"),
    ("otlp_endpoint", "collector:4318", "--otlp-endpoint"), ("alert_threshold", 1.5, "--alert-threshold"),
    ("alert_threshold", float("nan"), "--alert-threshold"), ("grace_seconds", -1, "--grace-seconds"),
    ("grace_seconds", float("inf"), "--grace-seconds"), ("grace_seconds", 1e20, "--grace-seconds"),
    ("served_model_name", "", "--served-model-name"), ("host", "", "--host"), ("cache_ram_bytes", -1, "--cache-ram"),
    ("cache_disk_bytes", 0, "--cache-disk"), ("max_tokens_limit", 0, "--max-tokens-limit"),
    ("max_prompt_tokens", 0, "--max-prompt-tokens"), ("request_timeout_seconds", 0, "--request-timeout"),
    ("max_streams_per_client", 0, "--max-streams-per-client"), ("allowed_origins", ("example.com",), "--allowed-origins"),
    ("allowed_hosts", ("a:80",), "--allowed-hosts"), ("api_key", "clé", "printable ASCII"),
])
def test_bad_settings_are_refused(field, value, says):
    """Each message names the option a user of `tandem serve` sets, not the field."""
    with pytest.raises(TandemError, match=says):
        ServeSettings(**{field: value})


@pytest.mark.parametrize("args,says", [
    (["--port", "eighty"], "--port must be an integer"),
    (["--port", "99999"], "--port must be an integer from 0 to 65535"),
    (["--cache", "memcached://x"], "redis://"),
    (["--grace-seconds", "soon"], "--grace-seconds must be a number"),
    (["--max-waiting", "-5"], "--max-waiting must be an integer from 0"),
])
def test_bad_serve_options_print_one_error_line(args, says, capsys):
    assert main(["serve", "--target", "smollm2-135m-instruct", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


def test_a_disk_budget_of_nothing_and_a_cache_folder_that_is_a_file_say_what_to_do(tmp_path):
    with pytest.raises(TandemError, match="leave out --cache-dir"):
        ServeSettings(cache_dir=str(tmp_path), cache_disk_bytes=0)
    (tmp_path / "afile").write_text("")
    with pytest.raises(TandemError, match="is a file, not a folder"):
        ServeSettings(cache_dir=str(tmp_path / "afile"))


def test_budgets_larger_than_the_machine_are_warned_of(tmp_path, monkeypatch):
    from tandem.serve import settings as settings_module

    monkeypatch.setattr(settings_module, "physical_memory_bytes", lambda: 16 << 30)
    monkeypatch.setattr(settings_module, "disk_room", lambda folder: 50 << 30)
    fits = ServeSettings(cache_ram_bytes=8 << 30, cache_dir=str(tmp_path), cache_disk_bytes=40 << 30)
    assert settings_module.cache_budget_warnings(fits) == []
    too_large = ServeSettings(cache_ram_bytes=500 << 30, cache_dir=str(tmp_path), cache_disk_bytes=900 << 30)
    ram, disk = settings_module.cache_budget_warnings(too_large)
    assert ram.startswith("--cache-ram 500.0 GiB is more than this machine's memory (16.0 GiB)")
    assert disk.startswith("--cache-disk 900.0 GiB is more than the disk has for the cache (50.0 GiB")


def test_served_model_name_defaults_to_the_target():
    assert default_model_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert default_model_name("/models/qwen-q4.gguf") == "qwen-q4"
    assert default_model_name("/models/my-hf-folder/") == "my-hf-folder"


def test_a_taken_port_is_a_clear_error():
    first = bind_socket("127.0.0.1", 0)
    first.listen()
    try:
        with pytest.raises(TandemError, match="cannot listen on 127.0.0.1"):
            bind_socket("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()


def test_an_ipv6_host_is_said_and_taken_as_urls_write_it():
    """`--host '[::1]'` (the form the start line prints) was "Name or service not known", and a
    taken port on `::` read "cannot listen on :::8672"."""
    from tandem.cli.main import build_parser
    from tandem.cli.serve_cmd import serve_settings

    assert serve_settings(build_parser().parse_args(["serve", "--host", "[::1]"])).host == "::1"
    first = bind_socket("::1", 0)
    first.listen()
    try:
        with pytest.raises(TandemError, match=rf"cannot listen on \[::1\]:{first.getsockname()[1]}: "):
            bind_socket("::1", first.getsockname()[1])
    finally:
        first.close()


def test_two_servers_bound_to_one_port_while_loading_the_second_to_listen_gets_one_line():
    """Both bind (neither listens while its models load); the first to listen wins. The other
    died after loading with uvicorn's two tracebacks and exit 1."""
    first = bind_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = bind_socket("127.0.0.1", port)
    try:
        claim(second, "127.0.0.1")
        with pytest.raises(TandemError, match=f"cannot listen on 127.0.0.1:{port}: .*another server took the port"):
            claim(first, "127.0.0.1")
    finally:
        first.close()
        second.close()


def test_the_response_cache_knows_another_model_at_the_same_path(tmp_path):
    """A Redis entry outlives the server that wrote it: another model later at the same path
    (or the same path's file rewritten) must not be answered with the first one's outputs. It
    was keyed by the path string; now by the files' size and time too (nothing hashed: a start
    stays fast), and by device and precision."""
    import os
    import shutil

    from tandem.engine.build import EngineConfig
    from tandem.models.backends import RunnerSpec
    from tandem.serve.server import model_identity
    from tiny_models import build_tiny_model

    def identity(folder, dtype="fp32", by_content=False):
        return model_identity(EngineConfig(RunnerSpec(str(folder), "torch", "cpu", dtype), None, "ngram"),
                              by_content)

    first = build_tiny_model(tmp_path / "first", seed=1)
    before, before_content = identity(first), identity(first, by_content=True)
    assert identity(first) == before  # the same files: the same model
    assert identity(first, by_content=True) == before_content
    assert identity(first, "bf16") != before  # another precision answers differently
    times = {file.name: file.stat().st_mtime_ns for file in first.iterdir()}
    shutil.rmtree(first)
    build_tiny_model(first, seed=2)  # another model at the same path
    for file in first.iterdir():  # a time of its own, whatever the filesystem's clock granularity
        os.utime(file, ns=(10**18, 10**18))
    assert identity(first) != before
    # ... or with the first one's times kept (cp -p, rsync -a) and the same size: only the
    # content tells them apart, which Redis's key (shared, outliving the server) uses
    for file in first.iterdir():
        os.utime(file, ns=(times[file.name], times[file.name]))
    assert identity(first) == before  # the cheap version is fooled: the in-memory cache's only
    assert identity(first, by_content=True) != before_content


def test_the_ngram_namespace_names_the_tokenizer(tmp_path):
    """The shared n-gram store holds token ids: servers under one served name but another
    tokenizer must not draft from each other's (in Redis they share a namespace by name)."""
    from tandem.engine.build import EngineConfig
    from tandem.models.backends import RunnerSpec
    from tandem.serve.server import ngram_namespace

    def namespace(folder):
        return ngram_namespace(EngineConfig(RunnerSpec(str(folder), "torch", "cpu"), None, "ngram"), "coder")

    for name, vocab in (("a", '{"a": 0}'), ("same", '{"a": 0}'), ("b", '{"b": 0}')):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(vocab)
    assert namespace(tmp_path / "a") == namespace(tmp_path / "same") != namespace(tmp_path / "b")
    assert namespace(tmp_path / "a").startswith("coder:")


def test_the_key_loses_the_white_space_around_it_and_a_blank_one_names_its_source():
    """A key mounted from a file ends in a newline no client sends: every request got a 401, and
    an empty $TANDEM_API_KEY was blamed on --api-key, which nobody had passed."""
    import pytest

    from tandem.cli.serve_cmd import api_key_of
    from tandem.errors import TandemError

    assert api_key_of(None, {"TANDEM_API_KEY": "k2\n"}) == "k2"
    assert api_key_of(" k1 ", {"TANDEM_API_KEY": "k2"}) == "k1"  # the option over the environment
    assert api_key_of(None, {}) is None
    with pytest.raises(TandemError, match=r"^\$TANDEM_API_KEY is empty"):
        api_key_of(None, {"TANDEM_API_KEY": ""})
    with pytest.raises(TandemError, match="^--api-key is empty"):
        api_key_of("  ", {})


def test_a_key_no_http_client_can_send_is_refused_at_start():
    """'clé' started a server whose key the OpenAI SDK could not send (UnicodeEncodeError) and
    curl's UTF-8 bytes did not match (401): only its Latin-1 bytes did."""
    import pytest

    from tandem.cli.serve_cmd import api_key_of
    from tandem.errors import TandemError

    with pytest.raises(TandemError, match=r"^\$TANDEM_API_KEY holds 'é'.*printable ASCII"):
        api_key_of(None, {"TANDEM_API_KEY": "clé-secret"})
    with pytest.raises(TandemError, match=r"^--api-key holds '\\t'"):
        api_key_of("a\tb", {})
    assert api_key_of("sk-A.b_c~1 2", {}) == "sk-A.b_c~1 2"


def test_a_low_open_file_limit_is_said_at_start(capsys):
    from tandem.serve.server import FEW_OPEN_FILES, warn_if_few_files

    warn_if_few_files(64)
    assert "may open only 64 files" in capsys.readouterr().err
    import resource

    warn_if_few_files(FEW_OPEN_FILES)
    warn_if_few_files(resource.RLIM_INFINITY)  # no limit (-1): it said "may open only -1 files"
    assert capsys.readouterr().err == ""
