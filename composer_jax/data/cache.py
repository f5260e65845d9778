"""Content-keyed cache directories, built once and atomically.

Every derived artefact (corpus, tokenizer, token shards, SFT samples) lives in
`<cache>/<kind>/<key>/`, where `key` hashes everything the artefact depends on. A directory is
built in a temporary sibling and renamed into place only when complete, so a crash never leaves a
half-built entry that a later run would trust, and concurrent builders cannot corrupt each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = "COMPLETE"


def stable_hash(obj: object, length: int = 16) -> str:
    """Hex digest of a JSON-serialisable object (key order independent)."""
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def build_once(root: str | os.PathLike, kind: str, key: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """Return `(root/kind/key, built_now)`, running `build(tmp_dir)` only if no complete entry exists.

    `build` writes its files into the directory it is given; on success the directory is marked
    complete and renamed into place.
    """
    final = Path(root) / kind / key
    if (final / COMPLETE_MARKER).is_file():
        return final, False
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(final.parent, key)
    tmp = final.parent / f".tmp-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        if final.exists():  # a stale incomplete entry, or another process won the race
            if (final / COMPLETE_MARKER).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
                return final, False
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, True


def _remove_abandoned(parent: Path, key: str) -> None:
    """Delete temporary build dirs of `key` left by processes that no longer exist (crashes)."""
    for tmp in parent.glob(f".tmp-{key}-*"):
        try:
            os.kill(int(tmp.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            continue
