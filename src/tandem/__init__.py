"""Tandem: lossless speculative decoding across heterogeneous hardware."""

__version__ = "0.1.0"
