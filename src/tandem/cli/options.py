"""Command-line options shared by `generate` and `bench`: models, backends, devices, drafting."""

import argparse

from tandem.models.backends import RunnerSpec
from tandem.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from tandem.speculation.drafters.registry import USES_MODEL
from tandem.engine.build import EngineConfig


def add_model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--target", default=DEFAULT_TARGET, help="catalog name, .gguf file or HF folder")
    group.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model (same tokenizer as the target)")
    group.add_argument("--drafter", default="hybrid", help="model | ngram | hybrid | none (default hybrid)")
    group.add_argument("--backend", default="auto", help="target backend: llamacpp | torch | auto")
    group.add_argument("--device", default="auto", help="target device: cpu, cuda:0, mps, npu:0, xpu ...")
    group.add_argument("--dtype", default="fp32", help="target dtype for torch: fp32 | bf16 | fp16")
    group.add_argument("--draft-backend", default="auto", help="draft backend: llamacpp | torch | auto")
    group.add_argument("--draft-device", default="auto", help="draft device")
    group.add_argument("--draft-dtype", default="fp32", help="draft dtype for torch")
    group.add_argument("--threads", type=int, default=None, help="CPU threads per model (default: all)")
    group.add_argument("--k", default="auto", help="speculation depth: an integer, or auto (default)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    target = RunnerSpec(args.target, args.backend, args.device, args.dtype, args.threads)
    draft = None
    if USES_MODEL.get(args.drafter, False):
        draft = RunnerSpec(args.draft, args.draft_backend, args.draft_device, args.draft_dtype, args.threads)
    return EngineConfig(target, draft, args.drafter, args.k)
