"""The fused torch runner: one forward pass over every slot's new tokens on a paged KV cache."""
