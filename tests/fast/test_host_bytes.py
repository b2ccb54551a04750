"""Saved states written once into the bytes kept, read in place (models/host_bytes.py)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tandem.models.host_bytes import HUGE_PAGES_FROM, bytes_address, bytes_buffer, new_bytes


def test_new_bytes_are_filled_through_their_buffer_and_read_in_place():
    data = new_bytes(4096)
    assert type(data) is bytes and len(data) == 4096
    pattern = (np.arange(4096) % 251).astype(np.uint8)
    np.frombuffer(bytes_buffer(data), dtype=np.uint8)[:] = pattern  # written once, through the buffer
    assert data == pattern.tobytes()
    view = np.frombuffer(bytes_buffer(data), dtype=np.uint8)
    assert view.ctypes.data == bytes_address(data)  # the same memory, not a copy


def _vma_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address`, from /proc/self/smaps."""
    inside, lines = False, Path("/proc/self/smaps").read_text().splitlines()
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= address < high
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_a_big_state_buffer_asks_for_huge_pages_before_it_is_written():
    """A saved state lands in new memory faulted in page by page; a big one's buffer is marked
    for transparent huge pages (VmFlags "hg"), a small one's is left alone, and either is
    written and read as before."""
    big = new_bytes(HUGE_PAGES_FROM + 12345)
    middle = bytes_address(big) + len(big) // 2
    assert "hg" in _vma_flags(middle)
    np.frombuffer(bytes_buffer(big), dtype=np.uint8)[:] = 7
    assert big[:3] == b"\x07\x07\x07" and big[-1] == 7
    small = new_bytes(64 * 1024)
    assert "hg" not in _vma_flags(bytes_address(small) + 100)
