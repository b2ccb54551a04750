"""Saved states written once into the bytes kept, read in place (models/host_bytes.py)."""

import numpy as np

from tandem.models.host_bytes import bytes_address, bytes_buffer, new_bytes


def test_new_bytes_are_filled_through_their_buffer_and_read_in_place():
    data = new_bytes(4096)
    assert type(data) is bytes and len(data) == 4096
    pattern = (np.arange(4096) % 251).astype(np.uint8)
    np.frombuffer(bytes_buffer(data), dtype=np.uint8)[:] = pattern  # written once, through the buffer
    assert data == pattern.tobytes()
    view = np.frombuffer(bytes_buffer(data), dtype=np.uint8)
    assert view.ctypes.data == bytes_address(data)  # the same memory, not a copy
