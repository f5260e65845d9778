"""The one declaration of batch fields: name -> dtype, logical axes, whether it is per token.

Placement (which mesh axes split each field), context-parallel reordering (which fields move to the
load-balanced token order, along which axis) and the train step (how each field splits into
microbatches, how it is sharded inside the step) all read a `BatchSchema`; nothing else lists
batch fields.

A field's logical axes name one entry per dim, from the rules table (composer_jax.parallel.rules):
`batch` marks the example axis (required: microbatches split it), `seq` the token axis (present
means the field is per token: context parallelism reorders it and the rules split it over
`context`), None an unsplit dim. Ranks 1 to 4, e.g.

  tokens            [B,T]        int32    ("batch", "seq")
  mtp_targets       [B,Dm,T]     int32    ("batch", None, "seq")
  advantages        [B]          float32  ("batch",)
  router_replay     [Lm,B,T,K]   int32    (None, "batch", "seq", None)

Fields marked `derived` are computed inside the step from the others (`token_index`,
`mtp_tokens`); they are never fed or placed, but they are reordered and sharded like the rest.

Shape glossary: B sequences, T tokens per sequence, Dm MTP depth, Lm MoE layers, K experts per
token.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Iterable, Mapping

from composer_jax.errors import ConfigError

_DTYPES = ("int32", "float32", "bfloat16", "bool")


@dataclasses.dataclass(frozen=True)
class Field:
    """One batch field. dtype: numpy dtype name; axes: logical axis name (or None) per dim."""
    dtype: str
    axes: tuple
    derived: bool = False
    doc: str = ""

    def __post_init__(self):
        object.__setattr__(self, "axes", tuple(self.axes))
        if self.dtype not in _DTYPES:
            raise ConfigError(f"batch field dtype {self.dtype!r} is not one of {_DTYPES}")
        if not 1 <= len(self.axes) <= 4:
            raise ConfigError(f"a batch field has rank 1 to 4; got axes {self.axes}")
        if self.axes.count("batch") != 1:
            raise ConfigError(f"a batch field needs exactly one 'batch' axis (microbatches split "
                              f"it); got axes {self.axes}")
        if self.axes.count("seq") > 1:
            raise ConfigError(f"a batch field has at most one 'seq' (token) axis; got {self.axes}")

    @property
    def rank(self) -> int:
        return len(self.axes)

    @property
    def batch_axis(self) -> int:
        return self.axes.index("batch")

    @property
    def per_token(self) -> bool:
        return "seq" in self.axes

    @property
    def token_axis(self) -> int | None:
        return self.axes.index("seq") if self.per_token else None


class BatchSchema:
    """An immutable mapping name -> Field. `extend` returns a new schema with more fields."""

    def __init__(self, fields: Mapping[str, Field]):
        self._fields = MappingProxyType(dict(fields))

    def __getitem__(self, name: str) -> Field:
        try:
            return self._fields[name]
        except KeyError:
            raise ConfigError(
                f"batch field {name!r} is not declared in the batch schema (declared: "
                f"{sorted(self._fields)}); declare it with BatchSchema.extend (see "
                f"composer_jax.parallel.batch_schema) in the loss that reads it") from None

    def __contains__(self, name) -> bool:
        return name in self._fields

    def __iter__(self):
        return iter(self._fields)

    def items(self):
        return self._fields.items()

    def names(self, *, derived: bool | None = None) -> tuple[str, ...]:
        """Field names (derived=False: the fed ones only; True: the derived ones only)."""
        return tuple(k for k, f in self._fields.items() if derived is None or f.derived == derived)

    def extend(self, fields: "Mapping[str, Field] | BatchSchema") -> "BatchSchema":
        """A schema with `fields` added; redeclaring a field with different contents is an error."""
        out = dict(self._fields)
        for k, f in fields.items():
            if k in out and out[k] != f:
                raise ConfigError(f"batch field {k!r} is already declared as {out[k]}; cannot "
                                  f"redeclare it as {f}")
            out[k] = f
        return BatchSchema(out)

    def check(self, batch: Mapping, names: Iterable[str] | None = None) -> None:
        """Raises a ConfigError naming the field when an array's rank or dtype does not match."""
        for k in (names if names is not None else batch):
            f, v = self[k], batch[k]
            if len(v.shape) != f.rank:
                raise ConfigError(f"batch field {k!r}: shape {tuple(v.shape)} has rank "
                                  f"{len(v.shape)}, the schema declares axes {f.axes}")
            if str(v.dtype) != f.dtype:
                raise ConfigError(f"batch field {k!r}: dtype {v.dtype}, the schema declares "
                                  f"{f.dtype}")

    def __eq__(self, other) -> bool:
        return isinstance(other, BatchSchema) and dict(self._fields) == dict(other._fields)

    def __hash__(self):
        return hash(tuple(sorted(self._fields.items())))

    def __repr__(self) -> str:
        return f"BatchSchema({dict(self._fields)})"


_TOK = ("batch", "seq")
_MTP = ("batch", None, "seq")

# The pretraining / SFT batch (what composer_jax.data emits) and the fields derived from it.
LM_FIELDS = BatchSchema({
    "tokens": Field("int32", _TOK, doc="input token ids"),
    "positions": Field("int32", _TOK, doc="RoPE positions (restart per packed document)"),
    "segment_ids": Field("int32", _TOK, doc="document id per token; 0 = padding"),
    "targets": Field("int32", _TOK, doc="next token"),
    "loss_mask": Field("float32", _TOK, doc="1 where the next-token loss counts"),
    "mtp_targets": Field("int32", _MTP, doc="token k+1 places ahead, per MTP depth"),
    "mtp_mask": Field("float32", _MTP, doc="1 where the MTP target lies in the same document"),
    "token_index": Field("int32", _TOK, derived=True,
                         doc="original token index (the causal mask under context parallelism)"),
    "mtp_tokens": Field("int32", (None, "batch", "seq"), derived=True,
                        doc="[Dm,B,T] MTP input tokens t_{i+k}"),
})

# Router replay: expert indices chosen at sampling time, reused by the forward pass.
ROUTER_REPLAY_FIELDS = BatchSchema({
    "router_replay": Field("int32", (None, "batch", "seq", None),
                           doc="[Lm,B,T,K] routed expert indices per MoE layer"),
    "mtp_router_replay": Field("int32", (None, "batch", "seq", None),
                               doc="[Dm,B,T,K] routed expert indices per MTP depth"),
})
