"""The tensors of a paged KV cache: per layer, one key and one value pool of
`num_blocks * block_size` rows, preallocated once (kv_blocks.py decides which rows a slot owns).
"""

import torch


class PagedKvCache:
    def __init__(self, num_layers: int, num_rows: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        shape = (num_rows, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]  # [rows, kv_heads, head_dim]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_row(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def write(self, layer: int, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """rows [tokens]; keys, values [tokens, kv_heads, head_dim]."""
        self.keys[layer].index_copy_(0, rows, keys)
        self.values[layer].index_copy_(0, rows, values)

    def gather(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [n, context] -> keys, values [n, context, kv_heads, head_dim]."""
        return self.keys[layer][rows], self.values[layer][rows]

    def read_rows(self, rows: torch.Tensor, out: torch.Tensor) -> None:
        """Every layer's keys, then values, at rows [n] into out [2 * layers, n, kv_heads, head_dim],
        which may live on another device (a host buffer): each layer crosses once."""
        for pool, pool_out in zip((*self.keys, *self.values), out):
            if pool_out.device == pool.device:
                torch.index_select(pool, 0, rows, out=pool_out)
            else:
                pool_out.copy_(pool[rows])

    def write_rows(self, rows: torch.Tensor, state: torch.Tensor) -> None:
        """The inverse of read_rows: state [2 * layers, n, kv_heads, head_dim], on any device, into rows [n]."""
        for pool, pool_state in zip((*self.keys, *self.values), state):
            pool.index_copy_(0, rows, pool_state.to(pool.device))

    def copy_blocks(self, copies: list[tuple[int, int]], block_size: int) -> None:
        """Copy-on-write: each (source, destination) block's rows, in every layer."""
        if not copies:
            return
        device = self.keys[0].device
        offsets = torch.arange(block_size, device=device)
        source = torch.tensor([s for s, _ in copies], device=device)[:, None] * block_size + offsets
        destination = torch.tensor([d for _, d in copies], device=device)[:, None] * block_size + offsets
        for pool in (*self.keys, *self.values):
            pool[destination.flatten()] = pool[source.flatten()]
