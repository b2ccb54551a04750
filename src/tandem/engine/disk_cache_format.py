"""The disk tier's file format (engine/disk_cache.py keeps the files):

    MAGIC | header length (4 bytes, little-endian) | header (JSON) | target state | draft state

The header names the model key, the format, the tokens each state holds, the states' sizes and
the SHA-256 of all of these with the states (format 1 summed the states alone, so a header's
tokens swapped with another file's restored one prompt's KV for another). Reading checks every
field, so a damaged, truncated, padded or hostile file is a ValueError, never another exception
and never a state of the wrong tokens.
"""

import hashlib
import json
import os
import struct

from tandem.engine.host_cache import HostEntry

MAGIC = b"TANDEMKV"
FORMAT = 2
_LENGTH = struct.Struct("<I")


def encode_entry(entry: HostEntry, model_key: str) -> bytes:
    payload = entry.target_state + (entry.draft_state or b"")
    fields = {"format": FORMAT, "model_key": model_key, "tokens": list(entry.tokens),
              "draft_tokens": list(entry.draft_tokens), "target_bytes": len(entry.target_state),
              "draft_bytes": None if entry.draft_state is None else len(entry.draft_state)}
    header = json.dumps({**fields, "sha256": _checksum(fields, payload)}).encode()
    return MAGIC + _LENGTH.pack(len(header)) + header + payload


def _checksum(fields: dict, payload: bytes) -> str:
    """SHA-256 of the header's fields (canonical JSON) and the states."""
    described = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(_LENGTH.pack(len(described)) + described + payload).hexdigest()


def read_entry(f, model_key: str, with_states: bool) -> HostEntry:
    """The entry in an open file; ValueError where it is not one of this model's whole files.
    Without states, only the header is read (the file's length is still checked)."""
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a Tandem prompt cache file")
    raw_length = f.read(_LENGTH.size)
    if len(raw_length) != _LENGTH.size:
        raise ValueError("truncated header")
    try:
        header = json.loads(f.read(_LENGTH.unpack(raw_length)[0]))
        if header["format"] != FORMAT:
            raise ValueError(f"format {header['format']}, this version reads {FORMAT}")
        if header["model_key"] != model_key:
            raise ValueError("saved by another model")
        tokens, draft_tokens = tuple(header["tokens"]), tuple(header["draft_tokens"])
        target_bytes, draft_bytes = header["target_bytes"], header["draft_bytes"]
        checksum = header["sha256"]
        if not (all(type(t) is int for t in tokens + draft_tokens) and type(target_bytes) is int
                and target_bytes >= 0 and (draft_bytes is None or type(draft_bytes) is int and draft_bytes >= 0)
                and isinstance(checksum, str)):
            raise TypeError("fields of the wrong type")
    except (KeyError, TypeError, AttributeError, RecursionError, json.JSONDecodeError,
            UnicodeDecodeError) as error:  # RecursionError: a header of deeply nested arrays
        raise ValueError(f"unreadable header ({error})") from None
    total = target_bytes + (draft_bytes or 0)
    if not with_states:
        here = f.tell()
        if f.seek(0, os.SEEK_END) - here != total:
            raise ValueError("truncated or padded states")
        return HostEntry(tokens, b"", draft_tokens, None)
    payload = f.read(total + 1)
    if len(payload) != total:
        raise ValueError("truncated or padded states")
    fields = {"format": FORMAT, "model_key": model_key, "tokens": list(tokens), "draft_tokens": list(draft_tokens),
              "target_bytes": target_bytes, "draft_bytes": draft_bytes}
    if _checksum(fields, payload) != checksum:
        raise ValueError("the header and states do not match their checksum")
    draft_state = None if draft_bytes is None else payload[target_bytes:]
    return HostEntry(tokens, payload[:target_bytes], draft_tokens, draft_state)
