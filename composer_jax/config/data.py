"""`DataConfig`: every setting of the corpus, tokenizer and input pipeline (frozen, validated).

Plain Python only (no numpy/JAX), so `composer_jax/config.py` can import it cheaply. Every field has
a default; fields are int/float/str/bool/str-Enum/tuple so the `--set data.x=v` override machinery
can type them. `__post_init__` raises `ConfigError` naming the field and what is valid.

The number of MTP depths is *not* a field: it belongs to the model config and is passed to the
pipeline builders as `mtp_depth` so the two can never disagree.
"""

from __future__ import annotations

import dataclasses
import enum
import os

from composer_jax.errors import ConfigError

CACHE_ENV_VAR = "COMPOSER_JAX_CACHE"
DEFAULT_CACHE_DIR = "~/.cache/composer_jax"


class SftSource(str, enum.Enum):
    """Where SFT samples come from (`composer_jax/data/sft.py`).

    ENV_ORACLE: the scripted oracle agent's resolved episodes over the training tasks of an
    environment task pool (`data.sft_pool`), in the policy's chat template with tool calls.
    DOCSTRINGS: docstring -> function chats from the corpus's train split (no pool needed).
    AUTO: ENV_ORACLE when `data.sft_pool` holds a task pool, else DOCSTRINGS (and says so).
    """

    AUTO = "auto"
    ENV_ORACLE = "env_oracle"
    DOCSTRINGS = "docstrings"


class SplitPattern(str, enum.Enum):
    """The regex that splits text into pre-tokens before byte-level BPE.

    KIMI is the pattern of Kimi K2's `tokenization_kimi.py` (digits in groups of 1-3, Han runs);
    use it when loading Kimi's `tiktoken.model`. CL100K is the GPT-4 pattern.
    """

    KIMI = "kimi"
    CL100K = "cl100k"


class CopySource(str, enum.Enum):
    """What a copy row (`data.copy_rows`) repeats spans of: its own code (the first half of an
    ordinary row) or uniformly random token ids (nothing to predict but the copy: the strongest
    signal for an induction head)."""

    CODE = "code"
    RANDOM = "random"
    RECALL = "recall"   # key-value records then queries of them (data/recall_rows.py); needs copy_source_tokens


class TurnWindows(str, enum.Enum):
    """Which short samples of single assistant turns (`data.sft_env.turn_windows`: the turn after
    only the message it answers) a ladder pool's oracle SFT store holds."""

    NONE = "none"            # whole demonstrations only
    ALL = "all"              # whole demonstrations, and a window of every assistant turn of the
                             # careful and renamed ones
    EDIT_ONLY = "edit_only"  # only the windows of turns that call an edit tool: the traceback, then the
                             # edit (no whole demonstration, no hasty one)
    EDIT_TAILS = "edit_tails"  # edit_only, each tool output cut to its last traceback frame and error
                             # line (`data.sft_env.traceback_tail`; windows without one are dropped):
                             # ~3x the edit calls per trained token
    EPISODES_AND_EDIT_TAILS = "episodes_and_edit_tails"  # the whole demonstrations (careful, renamed,
                             # hasty) and the edit tails: the protocol and the lookups together

    @classmethod
    def _missing_(cls, value):
        """The field was a bool before: true meant `all`, false `none` (configs of earlier runs)."""
        if not isinstance(value, (bool, str)):
            return None
        key = value.lower() if isinstance(value, str) else value
        return {True: cls.ALL, "true": cls.ALL, False: cls.NONE, "false": cls.NONE}.get(key)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Settings of the data side of pretraining and SFT.

    Corpus: `cache_dir` ("" = $COMPOSER_JAX_CACHE or ~/.cache/composer_jax), `source_roots` (empty =
    auto-discover every CPython standard library and site-packages on the machine), `max_files`
    (0 = all; >0 keeps a deterministic subset, for debug configs), the filters and the dedup.
    Tokenizer: `tokenizer_path` ("" = train a byte-level BPE of `vocab_size` on the corpus).
    Pipeline: `seq_len` T, `global_batch_size` (split evenly over hosts), `shuffle_seed`; `copy_rows`:
    the share of pretraining or SFT rows turned into copy rows (`data.copy_rows`, 0 = none), which
    copy their `copy_source`, one source of half the row or segments of `copy_source_tokens` each.
    SFT: `sft_source` (SftSource) and `sft_pool` (a task pool directory written by `env_generate`,
    for ENV_ORACLE); the docstring source's filters `sft_min_docstring_chars`, `sft_max_function_lines`;
    `sft_hasty`: the fraction of a ladder pool's training tasks (chosen by a hash of the task id) that
    get, besides their careful oracle demonstration, a hasty one (run the failing test, then finish
    claiming a fix without editing: a planted habit for RL to remove, `data.sft_env.hasty_messages`);
    `sft_recovery`: the fraction of ladder training tasks (another hash of the id) whose careful and
    renamed whole demonstrations also come as a recovery (`data.sft_env.recovery_messages`): first the
    edit call with the broken text copied into new_string too, its error (not trained), then the right
    edit and the rest;
    `sft_renames`: that many extra copies of each careful ladder demonstration with its copied names
    and read line numbers replaced at random (`data.sft_rename`), so the samples cannot be imitated
    by recalling the training tasks, only by copying from the context. `sft_value_weight`: the loss
    weight of the first token of each string argument value of the oracle's tool calls (which file,
    which text, what replaces it: the few tokens that decide a call; 1 = every trained token alike;
    the loss is then a weighted mean, `data.targets`). `sft_turn_windows` (TurnWindows): assistant
    turns of the careful and renamed ladder demonstrations also as short samples of their own, after
    only the message each answers (`data.sft_env.turn_windows`): many more edit calls per trained
    token; `edit_only` keeps only the edit turns' windows (a phase that trains the edit call alone),
    `edit_tails` those windows with the tool output cut to the last traceback frame and error line,
    `episodes_and_edit_tails` the tails beside the whole demonstrations. `sft_window_renames`: how many
    renamed copies give windows (0 = `sft_renames`; more = renamed copies that give only windows, so
    the short samples take a larger share of each batch than the whole demonstrations).
    `sft_window_context`: each window also with the 1..K messages before the one its turn answers
    (earlier calls, the task statement, the system prompt), so a lookup learnt right after a short
    output is trained where the episode's earlier messages come first too.
    """

    # --- corpus ---
    cache_dir: str = ""
    source_roots: tuple[str, ...] = ()
    include_site_packages: bool = True  # auto-discovered corpus also reads site-packages
    max_files: int = 0
    min_file_bytes: int = 64            # files smaller than this are dropped
    max_file_bytes: int = 400_000       # files larger than this are dropped
    max_line_length: int = 1000         # files with a longer line are dropped
    max_mean_line_length: int = 100     # files with a longer mean line are dropped
    min_alnum_fraction: float = 0.25    # files with fewer alphanumeric characters are dropped
    require_py3_syntax: bool = True     # files that do not parse as Python 3 are dropped
    # MinHash Jaccard similarity above which a file is a near-duplicate
    near_dup_threshold: float = 0.8
    minhash_perms: int = 128            # MinHash permutations per file
    minhash_bands: int = 16             # LSH bands of the MinHash signature
    shingle_size: int = 5               # tokens per shingle for MinHash
    validation_fraction: float = 0.02   # fraction of files held out for validation (by hashed path)
    split_salt: str = "composer_jax"    # salt of the train/validation hash split
    build_workers: int = 0              # processes building the corpus (0 = the CPU count)
    progress: bool = True               # show progress bars while building
    # --- tokenizer ---
    vocab_size: int = 4096
    tokenizer_path: str = ""
    split_pattern: SplitPattern = SplitPattern.KIMI  # pre-tokenizer regex: kimi | cl100k
    tokenizer_train_bytes: int = 32_000_000  # corpus bytes the BPE tokenizer is trained on
    # --- pipeline ---
    seq_len: int = 2048
    global_batch_size: int = 8
    shuffle_seed: int = 0
    add_bos_eos: bool = True            # wrap each document in BOS/EOS before packing
    num_threads: int = 2                # input-pipeline reader threads
    prefetch_buffer_size: int = 4       # batches prefetched ahead of the step
    num_workers: int = 0                # grain worker processes (0 = in-process)
    eval_max_batches: int = 0           # caps the validation batches per evaluation (0 = no cap)
    copy_rows: float = 0.0              # fraction of pretraining rows whose second half repeats spans
                                        # of their first half (teaches copying from context; copy_rows.py)
    copy_source: CopySource = CopySource.CODE  # what copy rows copy: code | random token ids | recall
                                        # (key-value records, then queries: lookup by a key a few back)
    copy_random_ids: int = 0            # copy_source=random|recall: draw from the first N non-special ids
                                        # (0 = all; a few hundred: each id is seen often, the copy
                                        # circuit forms in fewer steps)
    copy_source_tokens: int = 0         # > 0: copy rows are segments of this many source tokens then
                                        # spans of them, 2x as long (copies at that distance, many per
                                        # row); 0 = one source, the first half of the row
    # --- SFT samples (SftSource; sft_max_samples > 0: the first N docstring samples / training tasks) ---
    sft_source: SftSource = SftSource.AUTO
    sft_pool: str = ""
    sft_max_samples: int = 0            # > 0: only the first N SFT samples / training tasks
    sft_min_docstring_chars: int = 24
    sft_max_function_lines: int = 60
    sft_hasty: float = 0.0              # ladder pools: share of tasks with an extra hasty demonstration
    sft_recovery: float = 0.0           # ladder pools: share of tasks whose demonstrations also come
                                        # with a failed first edit they recover from
    sft_renames: int = 0                # ladder pools: renamed copies per careful demonstration
                                        # (`data.sft_rename`: imitating them needs copying)
    sft_value_weight: float = 1.0       # loss weight of argument values' first tokens (oracle samples)
    sft_turn_windows: TurnWindows = TurnWindows.NONE  # ladder pools: single assistant turns alone, after
                                        # the one message each answers: none | all | edit_only |
                                        # edit_tails | episodes_and_edit_tails
    sft_window_renames: int = 0         # renamed copies that give windows (0 = sft_renames)
    sft_window_context: int = 0         # windows also with 1..K earlier messages before them
    sft_prompt_tools: tuple[str, ...] = ()  # tools declared in the oracle samples' prompt (() = all;
                                            # the `sft` experiment sets it from env.prompt_tools)
    sft_declare_tools: bool = True      # declare tools in the samples' prompt at all (the `sft`
                                        # experiment sets it from env.declare_tools)

    def __post_init__(self) -> None:
        if isinstance(self.split_pattern, str) and not isinstance(self.split_pattern, SplitPattern):
            valid = [p.value for p in SplitPattern]
            if self.split_pattern not in valid:
                raise ConfigError(f"data.split_pattern={self.split_pattern!r}: valid values are {valid}")
            object.__setattr__(self, "split_pattern", SplitPattern(self.split_pattern))
        if not isinstance(self.copy_source, CopySource):
            valid = [c.value for c in CopySource]
            if self.copy_source not in valid:
                raise ConfigError(f"data.copy_source={self.copy_source!r}: valid values are {valid}")
            object.__setattr__(self, "copy_source", CopySource(self.copy_source))
        if not isinstance(self.sft_turn_windows, TurnWindows):
            try:
                object.__setattr__(self, "sft_turn_windows", TurnWindows(self.sft_turn_windows))
            except ValueError:
                raise ConfigError(f"data.sft_turn_windows={self.sft_turn_windows!r}: valid values are "
                                  f"{[w.value for w in TurnWindows]}") from None
        if not isinstance(self.sft_source, SftSource):
            valid = [s.value for s in SftSource]
            if self.sft_source not in valid:
                raise ConfigError(f"data.sft_source={self.sft_source!r}: valid values are {valid}")
            object.__setattr__(self, "sft_source", SftSource(self.sft_source))
        if not isinstance(self.sft_pool, str):
            raise ConfigError(f"data.sft_pool={self.sft_pool!r}: must be a directory path (\"\" = none)")
        if not isinstance(self.source_roots, tuple) or not all(isinstance(r, str) for r in self.source_roots):
            raise ConfigError(f"data.source_roots={self.source_roots!r}: must be a tuple of directory paths")
        for name, minimum in _INT_MINIMUMS.items():
            _check_int(self, name, minimum)
        _check_int(self, "max_file_bytes", max(1, self.min_file_bytes + 1))
        for name, (upper_inclusive, lower_exclusive) in _FRACTIONS.items():
            _check_fraction(self, name, upper_inclusive=upper_inclusive, lower_exclusive=lower_exclusive)
        if self.copy_rows == 0 and (self.copy_source != CopySource.CODE or self.copy_random_ids):
            raise ConfigError(f"data.copy_source={self.copy_source.value!r} / data.copy_random_ids="
                              f"{self.copy_random_ids} shape copy rows, but data.copy_rows=0 makes none: set "
                              "data.copy_rows > 0, or leave them at their defaults")
        if self.copy_source_tokens and not self.copy_rows:
            raise ConfigError(f"data.copy_source_tokens={self.copy_source_tokens} shapes copy rows, but "
                              "data.copy_rows=0 makes none: set data.copy_rows > 0, or data.copy_source_tokens=0")
        if 2 * self.copy_source_tokens > self.seq_len:
            raise ConfigError(f"data.copy_source_tokens={self.copy_source_tokens}: a source and its copy "
                              f"need 2 x {self.copy_source_tokens} tokens, more than data.seq_len={self.seq_len}: "
                              "lower it (or 0: half the row)")
        if self.copy_source == CopySource.RECALL and not self.copy_source_tokens:
            raise ConfigError("data.copy_source=recall builds segments of 2 x data.copy_source_tokens tokens: "
                              "set data.copy_source_tokens > 0 (e.g. 128)")
        if self.copy_random_ids and self.copy_source == CopySource.CODE:
            raise ConfigError(f"data.copy_random_ids={self.copy_random_ids} applies to random ids only: "
                              "set data.copy_source=random or recall, or data.copy_random_ids=0")
        for name in ("sft_window_context", "sft_window_renames"):
            if getattr(self, name) and self.sft_turn_windows == TurnWindows.NONE:
                raise ConfigError(f"data.{name}={getattr(self, name)} shapes SFT windows, but "
                                  "data.sft_turn_windows=none makes none: set data.sft_turn_windows (e.g. "
                                  f"episodes_and_edit_tails), or data.{name}=0")
        if (isinstance(self.sft_value_weight, bool) or not isinstance(self.sft_value_weight, (int, float))
                or not 0 < self.sft_value_weight <= 1000):
            raise ConfigError(f"data.sft_value_weight={self.sft_value_weight!r}: must be a number in (0, 1000] "
                              "(1 = argument values' first tokens weigh like every other trained token)")
        if self.minhash_perms % self.minhash_bands:
            raise ConfigError(f"data.minhash_bands={self.minhash_bands}: must divide data.minhash_perms="
                              f"{self.minhash_perms}")
        if self.tokenizer_path and not os.path.isfile(os.path.expanduser(self.tokenizer_path)):
            raise ConfigError(f"data.tokenizer_path={self.tokenizer_path!r}: no such file (use \"\" to train a "
                              "tokenizer on the corpus, or a tokenizer.json / tiktoken BPE file)")


# Integer fields and their minimum; fractions and (upper bound inclusive, lower bound exclusive).
_INT_MINIMUMS = {
    "max_files": 0, "min_file_bytes": 0, "max_line_length": 1, "max_mean_line_length": 1, "minhash_perms": 1,
    "minhash_bands": 1, "shingle_size": 1, "build_workers": 0, "vocab_size": 512, "tokenizer_train_bytes": 1,
    "seq_len": 2, "global_batch_size": 1, "num_threads": 0, "prefetch_buffer_size": 0, "num_workers": 0,
    "eval_max_batches": 0, "copy_random_ids": 0, "copy_source_tokens": 0, "sft_max_samples": 0, "sft_renames": 0,
    "sft_window_renames": 0, "sft_window_context": 0,
    "sft_min_docstring_chars": 0, "sft_max_function_lines": 1,
}
_FRACTIONS = {"min_alnum_fraction": (True, False), "near_dup_threshold": (True, True),
              "validation_fraction": (False, False), "sft_hasty": (True, False),
              "sft_recovery": (True, False),
              "copy_rows": (True, False)}


def resolved_cache_dir(cfg: DataConfig) -> str:
    """The cache directory: `cfg.cache_dir`, else $COMPOSER_JAX_CACHE, else ~/.cache/composer_jax."""
    raw = cfg.cache_dir or os.environ.get(CACHE_ENV_VAR, "") or DEFAULT_CACHE_DIR
    return os.path.abspath(os.path.expanduser(raw))


def _check_int(cfg: DataConfig, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"data.{name}={value!r}: must be an integer >= {minimum}")


def _check_fraction(cfg: DataConfig, name: str, *, upper_inclusive: bool, lower_exclusive: bool = False) -> None:
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > 0 if lower_exclusive else value >= 0) and (value <= 1 if upper_inclusive else value < 1)
    if not ok:
        low = "(0" if lower_exclusive else "[0"
        high = "1]" if upper_inclusive else "1)"
        raise ConfigError(f"data.{name}={value!r}: must be a number in {low}, {high}")
