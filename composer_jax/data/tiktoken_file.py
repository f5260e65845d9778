"""tiktoken-style BPE files (e.g. Kimi's `tiktoken.model`): one `base64(token bytes) rank` per line.

`tokenizer_from_ranks` turns the ranks into an equivalent Hugging Face byte-level BPE: the vocab maps
GPT-2 byte-to-unicode strings to the rank, and the merge list is derived from the ranks the way
tiktoken applies them (a token of rank r is the merge of two shorter tokens; merges are ordered by
the rank of their result, ties by the ranks of the parts). `ignore_merges=True` reproduces
tiktoken's shortcut of emitting a whole pre-token directly when it is itself in the vocabulary.
"""

from __future__ import annotations

import base64
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from composer_jax.data.errors import DataError


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_ranks(path: str | os.PathLike) -> dict[bytes, int]:
    """Parse a tiktoken BPE file; errors name the file and line."""
    ranks: dict[bytes, int] = {}
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise DataError(f"cannot read tiktoken BPE file {path}: {e}") from e
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64, validate=True)] = int(rank)
        except ValueError as e:
            raise DataError(f"{path}:{number}: expected 'base64-token rank', got {line[:80]!r}") from e
    if not ranks:
        raise DataError(f"tiktoken BPE file {path} is empty")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise DataError(f"tiktoken BPE file {path}: ranks must be exactly 0..{len(ranks) - 1}, each once")
    return ranks


def write_ranks(ranks: dict[bytes, int], path: str | os.PathLike) -> None:
    """Write ranks in tiktoken's format, sorted by rank."""
    with open(path, "wb") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")


def tokenizer_from_ranks(ranks: dict[bytes, int], pattern: str) -> Tokenizer:
    """A Hugging Face `Tokenizer` that encodes exactly like tiktoken with `ranks` and `pattern`."""
    table = bytes_to_unicode()

    def to_str(token: bytes) -> str:
        return "".join(table[b] for b in token)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    vocab = {to_str(token): rank for token, rank in ranks.items()}
    model = models.BPE(vocab=vocab, merges=[(to_str(m[3]), to_str(m[4])) for m in merges],
                       ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer
