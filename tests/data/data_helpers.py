"""Helpers shared by the data tests: writing source trees and small configs."""

from __future__ import annotations

import os
import sysconfig
import textwrap

from composer_jax.data.config import DataConfig


def write(root, relpath: str, content: str | bytes) -> str:
    path = os.path.join(str(root), relpath)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(path, mode) as f:
        f.write(content)
    return path


def module_source(index: int, lines: int = 30) -> str:
    """A distinct, realistic-looking module (distinct words so MinHash sees it as different)."""
    body = "\n".join(f"    value_{index}_{k} = compute_{index}(item_{k}, factor={k * index + 7})" for k in range(lines))
    return textwrap.dedent(f'''\
        """Module number {index} of the synthetic corpus."""

        import math


        def compute_{index}(item, factor=1):
            """Scale item {index} by factor and take the square root of the result."""
            total = item * factor
            return math.sqrt(abs(total))


        def run_{index}(items):
        ''') + body + "\n    return items\n"


def stdlib_dirs() -> tuple[str, ...]:
    stdlib = sysconfig.get_paths()["stdlib"]
    return (os.path.join(stdlib, "json"), os.path.join(stdlib, "email"))


def small_config(cache_dir, **overrides) -> DataConfig:
    settings = dict(cache_dir=str(cache_dir), source_roots=stdlib_dirs(), vocab_size=600, seq_len=64,
                    global_batch_size=4, validation_fraction=0.2, progress=False, num_threads=0,
                    prefetch_buffer_size=0)
    settings.update(overrides)
    return DataConfig(**settings)
