"""Lossless encoding of weight bit patterns: full chunks and deltas against the previous version.

Pure numpy + zstd, no JAX. Everything works on *bit patterns*: a bf16 tensor is handled as its
uint16 view, an fp32 one as uint32, so a rebuilt tensor is bit-for-bit the published one (NaN
payloads and signed zeros included).

Shape glossary: N elements of one flattened shard, C elements of one chunk (C <= chunk_elems),
K changed elements of a chunk, W bytes per element (2 for bf16).

Blob formats (every blob is one zstd frame with its content checksum, so a flipped byte fails
to decompress instead of silently decoding to something else):
  full    byte planes of the C bit patterns (all low bytes, then all next bytes, ...).
  sparse  u32 K | byte planes of the K position gaps (u32) | byte planes of the K XOR values.
          Positions are stored as gaps (first position, then differences minus one): at RL
          learning rates changes are rare and spread out, so gaps are small and their high byte
          planes are all zero, which zstd squeezes to almost nothing.
  xor     byte planes of (new XOR old) for all C elements (zero where unchanged).
The XOR of two nearby floats has its high bytes zero (same sign and exponent) and only a few low
mantissa bits set, so the value planes compress well too.
"""
from __future__ import annotations

import enum
import hashlib

import numpy as np
import zstandard

from composer_jax.errors import ComposerError


class WeightStoreError(ComposerError):
    """A version is missing, incomplete or does not fit the reader's request."""


class CorruptWeightsError(WeightStoreError):
    """Stored bytes do not decode to what was published (checksum or zstd frame mismatch)."""


class DeltaCodec(str, enum.Enum):
    SPARSE = "sparse"   # changed positions (gaps) + XOR of the changed values
    XOR = "xor"         # XOR of every element with the previous version


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits_view(x: np.ndarray) -> np.ndarray:
    """The unsigned-integer view of `x`'s bit patterns (same shape; bf16 -> uint16, f32 -> uint32)."""
    x = np.asarray(x)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    if x.dtype.itemsize not in _UINT:
        raise WeightStoreError(f"cannot ship dtype {x.dtype} (itemsize {x.dtype.itemsize}); "
                               f"use a 1, 2, 4 or 8 byte dtype")
    return x.view(_UINT[x.dtype.itemsize])


def checksum(bits: np.ndarray) -> str:
    """blake2b-64 hex digest of an array's raw bytes (C order)."""
    return hashlib.blake2b(np.ascontiguousarray(bits).data, digest_size=8).hexdigest()


def combine_checksums(parts: list[str]) -> str:
    """One checksum for a tensor from its shards' checksums (in shard order)."""
    return hashlib.blake2b("".join(parts).encode(), digest_size=8).hexdigest()


def chunk_spans(n: int, chunk_elems: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges that cover n elements in chunks of chunk_elems."""
    if chunk_elems < 1:
        raise WeightStoreError(f"chunk_elems must be >= 1, got {chunk_elems}")
    return [(s, min(s + chunk_elems, n)) for s in range(0, max(n, 1), chunk_elems)] if n else []


def _planes(a: np.ndarray) -> bytes:
    """Byte-plane (shuffle) layout of a 1-D unsigned array: plane b holds byte b of every element."""
    w = a.dtype.itemsize
    if w == 1:
        return a.tobytes()
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, w).T).tobytes()


def _unplanes(buf: memoryview | bytes, n: int, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    w = dtype.itemsize
    raw = np.frombuffer(buf, np.uint8, count=n * w)
    if w == 1:
        return raw.copy()
    return np.ascontiguousarray(raw.reshape(w, n).T).view(dtype).reshape(n)


def _compress(payload: bytes, level: int) -> bytes:
    return zstandard.ZstdCompressor(level=level, write_checksum=True,
                                    write_content_size=True).compress(payload)


def _decompress(blob: bytes, what: str, max_size: int) -> bytes:
    """One zstd frame -> its bytes. The frame header's declared content size is checked against
    `max_size` (what the caller can possibly expect) before anything is allocated: a corrupt
    header must not turn into a MemoryError."""
    try:
        declared = zstandard.frame_content_size(blob)
    except zstandard.ZstdError as e:
        raise CorruptWeightsError(f"{what}: stored chunk has no valid zstd frame header ({e}); the "
                                  f"store is corrupt, fetch another version or republish") from e
    if declared < 0 or declared > max_size:
        raise CorruptWeightsError(f"{what}: zstd frame declares {declared} content bytes "
                                  f"(expected at most {max_size}; -1 = unknown); the store is "
                                  f"corrupt, fetch another version or republish")
    try:
        out = zstandard.ZstdDecompressor().decompress(blob, max_output_size=max_size)
    except (zstandard.ZstdError, MemoryError) as e:
        raise CorruptWeightsError(f"{what}: stored chunk does not decompress ({e!r}); the store "
                                  f"is corrupt, fetch another version or republish") from e
    if len(out) != declared:
        raise CorruptWeightsError(f"{what}: decoded {len(out)} bytes, the frame declares "
                                  f"{declared}")
    return out


def encode_full(bits: np.ndarray, level: int = 3) -> bytes:
    """A chunk's C bit patterns [C] (unsigned dtype) -> one zstd blob."""
    return _compress(_planes(np.ascontiguousarray(bits).reshape(-1)), level)


def decode_full(blob: bytes, n: int, dtype, what: str = "chunk") -> np.ndarray:
    """Inverse of encode_full: -> [n] array of `dtype` (unsigned)."""
    raw = _decompress(blob, what, n * np.dtype(dtype).itemsize)
    if len(raw) != n * np.dtype(dtype).itemsize:
        raise CorruptWeightsError(f"{what}: decoded {len(raw)} bytes, expected "
                                  f"{n * np.dtype(dtype).itemsize}")
    return _unplanes(raw, n, dtype)


def encode_delta(new: np.ndarray, old: np.ndarray, codec: DeltaCodec = DeltaCodec.SPARSE,
                 level: int = 3) -> bytes | None:
    """Delta of one chunk, new [C] vs old [C] (same unsigned dtype). None when nothing changed."""
    new = np.ascontiguousarray(new).reshape(-1)
    old = np.ascontiguousarray(old).reshape(-1)
    if new.shape != old.shape or new.dtype != old.dtype:
        raise WeightStoreError(f"delta needs equal shapes/dtypes, got {new.shape}/{new.dtype} vs "
                               f"{old.shape}/{old.dtype}")
    x = new ^ old
    idx = np.flatnonzero(x)
    if idx.size == 0:
        return None
    if DeltaCodec(codec) == DeltaCodec.XOR:
        return _compress(_planes(x), level)
    if new.size >= 2 ** 32:
        raise WeightStoreError("a chunk must hold fewer than 2**32 elements")
    gaps = np.empty(idx.size, np.uint32)
    gaps[0] = idx[0]
    np.subtract(idx[1:], idx[:-1] + 1, out=gaps[1:], casting="unsafe")
    head = np.array([idx.size], np.uint32).tobytes()
    return _compress(head + _planes(gaps) + _planes(x[idx]), level)


def apply_delta(blob: bytes, old: np.ndarray, codec: DeltaCodec = DeltaCodec.SPARSE,
                what: str = "chunk") -> np.ndarray:
    """old [C] + delta blob -> new [C] (a new array; `old` is not modified)."""
    old = np.ascontiguousarray(old).reshape(-1)
    w = old.dtype.itemsize
    bound = old.size * w if DeltaCodec(codec) == DeltaCodec.XOR else 4 + old.size * (4 + w)
    raw = _decompress(blob, what, bound)
    if DeltaCodec(codec) == DeltaCodec.XOR:
        if len(raw) != old.size * w:
            raise CorruptWeightsError(f"{what}: xor delta has {len(raw)} bytes, expected "
                                      f"{old.size * w}")
        return old ^ _unplanes(raw, old.size, old.dtype)
    if len(raw) < 4:
        raise CorruptWeightsError(f"{what}: sparse delta too short ({len(raw)} bytes)")
    k = int(np.frombuffer(raw, np.uint32, count=1)[0])
    if len(raw) != 4 + k * (4 + w) or k > old.size:
        raise CorruptWeightsError(f"{what}: sparse delta of {len(raw)} bytes does not hold {k} "
                                  f"changes of a {old.size}-element chunk")
    mv = memoryview(raw)
    gaps = _unplanes(mv[4:4 + 4 * k], k, np.uint32).astype(np.int64)
    vals = _unplanes(mv[4 + 4 * k:], k, old.dtype)
    idx = np.cumsum(gaps + 1) - 1
    if k and idx[-1] >= old.size:
        raise CorruptWeightsError(f"{what}: sparse delta position {idx[-1]} is outside the chunk "
                                  f"of {old.size} elements")
    out = old.copy()
    out[idx] ^= vals
    return out
