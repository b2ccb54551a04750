"""llama.cpp backend: a GGUF model through llama-cpp-python, one sequence, CPU (or whatever
llama.cpp was built for).

Uses the library's batch API directly so each forward asks for logits only at the positions
the engine needs, and rolls the KV cache back with `seq_rm`.
"""

import os
from typing import Sequence

import numpy as np

from tandem.errors import TandemError
from tandem.models.cost import CostModel

DEFAULT_CONTEXT = 4096


class LlamaCppRunner:
    def __init__(self, gguf_path: str, context_length: int = DEFAULT_CONTEXT, threads: int | None = None):
        from llama_cpp import Llama

        threads = threads or os.cpu_count() or 1
        try:
            self._llm = Llama(
                model_path=str(gguf_path),
                n_ctx=context_length,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as error:
            raise TandemError(f"llama.cpp cannot load {gguf_path}: {error}") from None
        self._ctx = self._llm._ctx
        self._batch = self._llm._batch  # holds up to n_batch tokens
        self._batch_capacity = self._llm.n_batch
        self.name = f"{os.path.basename(str(gguf_path))} [llamacpp/cpu/{threads}t]"
        self.vocab_size = int(self._llm.n_vocab())
        self.context_length = int(self._llm.n_ctx())
        self.cost = CostModel()
        self._length = 0

    @property
    def num_cached_tokens(self) -> int:
        return self._length

    def reset(self) -> None:
        self.rollback(0)

    def rollback(self, length: int) -> None:
        if length < self._length:
            self._ctx.kv_cache_seq_rm(-1, length, -1)
            self._length = length

    def forward(self, token_ids: Sequence[int], num_logits: int | None = None) -> np.ndarray:
        tokens = list(token_ids)
        wanted = len(tokens) if num_logits is None else min(num_logits, len(tokens))
        first_with_logits = len(tokens) - wanted
        rows = []
        for start in range(0, len(tokens), self._batch_capacity):
            chunk = tokens[start : start + self._batch_capacity]
            flagged = self._fill_batch(chunk, start, first_with_logits)
            self._ctx.decode(self._batch)
            self._length += len(chunk)
            if flagged:
                logits = np.ctypeslib.as_array(self._ctx.get_logits(), shape=(flagged * self.vocab_size,))
                rows.append(logits.reshape(flagged, self.vocab_size).copy())  # [flagged, vocab]
        if not rows:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        return np.concatenate(rows)  # [wanted, vocab]

    def _fill_batch(self, chunk: list[int], offset: int, first_with_logits: int) -> int:
        batch = self._batch.batch
        batch.n_tokens = len(chunk)
        flagged = 0
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = self._length + i
            batch.seq_id[i][0] = 0
            batch.n_seq_id[i] = 1
            want = offset + i >= first_with_logits
            batch.logits[i] = want
            flagged += want
        return flagged
