"""Continued pretraining on code, the long-context extension, and SFT.

cpt_debug  tiny model, a few hundred local files, CPU, minutes (CI uses it)
cpt_small  the `small` config on the whole local corpus, ~25 minutes on 2 CPU cores
cpt_32k    stage 1 of the recipe for kimi_k2_5: 32k-token sequences (a pod job; try --dry_run)
cpt_256k   stage 2: YaRN long-context extension to 256k from a cpt_32k run (train.init_from)
sft        a short SFT stage on chat-formatted samples, loss on assistant tokens only: the
           environment oracle's episodes over a task pool's training tasks (data.sft_pool, else
           env.pool_dir, else WORKDIR/pool -- where `env_generate --workdir=WORKDIR` writes it), or,
           when there is no pool, docstring -> function chats from the corpus (data.sft_source)

Hyper-parameters of cpt_32k / cpt_256k and their sources (Kimi K2 technical report,
arXiv:2507.20534, sections 2-3; the Composer 2 CPT settings are not public):
  * optimizer MuonClip (Muon on matrices with QK-clip; AdamW on embeddings/norms) -> Optimizer.MUON
  * weight decay 0.1; peak learning rate 2e-4; warmup 500 steps; WSD-style schedule (constant,
    then decay to 2e-5 in the annealing phase) -> Schedule.WSD, min_lr_ratio 0.1
  * global batch 67M tokens: 2048 sequences of 32k -> data.global_batch_size=2048
  * long-context activation with YaRN (K2: 4k -> 32k -> 128k; K2.5 serves 256k):
    rope factor 64 over an original 4096 positions for 256k.
  * MTP: K2 ships none; the Composer recipe trains fresh MTP layers (mtp_depth=1,
    self-distillation towards the main head, lambda 0.3 -> 0.1 as DeepSeek-V3 did).
"""
from __future__ import annotations

import dataclasses
import pathlib

from composer_jax import registry
from composer_jax.config import (Config, MeshConfig, MTPLoss, Optimizer, Remat, RopeScaling,
                                 Schedule, TrainConfig, bf16, kimi_k2_5, small, tiny)
from composer_jax.data.config import DataConfig, SftSource
from composer_jax.errors import ConfigError


def _debug() -> Config:
    model = dataclasses.replace(tiny(), name="cpt_debug", vocab_size=1024, hidden_size=96,
                                num_layers=3, num_heads=4, dense_intermediate_size=256,
                                moe_intermediate_size=64, num_routed_experts=8,
                                num_experts_per_tok=2)
    data = DataConfig(max_files=600, vocab_size=1024, seq_len=128, global_batch_size=16,
                      tokenizer_train_bytes=3_000_000)
    train = TrainConfig(steps=320, lr=3e-3, warmup_steps=20, log_every=10, eval_every=40,
                        eval_batches=8, checkpoint_every=40, keep_checkpoints=2)
    return Config(model=model, data=data, train=train)


def _small() -> Config:
    # Muon beat AdamW at the same LR and batch: val 5.89 vs 6.29 after 160 steps of 16 x 256
    # (benchmarks/results/cpt_small_sweep.txt); a higher Muon LR (5e-3) was worse at step 80.
    data = DataConfig(vocab_size=4096, seq_len=256, global_batch_size=16)
    train = TrainConfig(steps=800, lr=2e-3, warmup_steps=40, optimizer=Optimizer.MUON,
                        log_every=20, eval_every=100, eval_batches=8, checkpoint_every=200,
                        keep_checkpoints=2, mtp_loss=MTPLoss.SUPERVISED)
    return Config(model=small(), data=data, train=train)


def _k2_train(steps: int) -> TrainConfig:
    return TrainConfig(steps=steps, lr=2e-4, min_lr_ratio=0.1, warmup_steps=500,
                       schedule=Schedule.WSD, decay_fraction=0.2, optimizer=Optimizer.MUON,
                       weight_decay=0.1, grad_clip=1.0, mtp_loss=MTPLoss.SELF_DISTILL,
                       mtp_lambda=0.3, log_every=10, eval_every=500, checkpoint_every=500)


# Parallel layout for the pod stages, from the dry-run planner (README "Parallelism",
# benchmarks/results/dry_run_{32k,256k}.json): expert parallelism sized independently of tensor
# parallelism (tensor 1), context parallelism with the MLA latent all-gathered, fsdp filling the rest
# (1 on 256 devices), 32 microbatches of 8192 tokens per device, 512-key attention blocks, and a
# 1.25 expert capacity factor (bounded all-to-all receive buffers).
def _pod_layout(cfg: Config, expert: int, context: int) -> Config:
    mesh = MeshConfig(fsdp=-1, expert=expert, context=context, tensor=1, rules="cp_ep",
                      cp_attention="allgather")
    execution = dataclasses.replace(cfg.execution, attention_kv_block=512,
                                    moe_capacity_factor=1.25)
    train = dataclasses.replace(cfg.train, microbatches=32)
    return dataclasses.replace(cfg, mesh=mesh, execution=execution, train=train)


def _pod_execution():
    """BF16 weights and activations, every block rematerialised."""
    return dataclasses.replace(bf16(), remat=Remat.FULL)


def _cpt_32k() -> Config:
    model = dataclasses.replace(kimi_k2_5(), mtp_depth=1)
    data = DataConfig(seq_len=32768, global_batch_size=2048, vocab_size=163840)
    return _pod_layout(Config(model=model, execution=_pod_execution(), data=data,
                              train=_k2_train(steps=20_000)), expert=64, context=4)


def _cpt_256k() -> Config:
    base = kimi_k2_5()
    rope = dataclasses.replace(base.rope, scaling=RopeScaling.YARN, factor=64.0,
                               original_max_position=4096)
    model = dataclasses.replace(base, mtp_depth=1, rope=rope, max_position_embeddings=262144)
    data = DataConfig(seq_len=262144, global_batch_size=256, vocab_size=163840)
    train = dataclasses.replace(_k2_train(steps=2_000), lr=2e-5, warmup_steps=100,
                                init_from="runs/cpt_32k")
    return _pod_layout(Config(model=model, execution=_pod_execution(), data=data, train=train),
                       expert=8, context=32)


def _sft() -> Config:
    # The cpt_debug model and tokenizer (so `--set train.init_from=<a cpt_debug workdir>` works). An
    # oracle transcript is ~2.3-3k tokens with its 1k vocabulary (the tool declarations alone are
    # ~1.8k, untrained), so rows are 3072 long and hold one transcript each (or ~20 docstring chats).
    # The RL policy must reproduce a 70-290-token tool call exactly, so the 12 oracle transcripts
    # are memorised: 80 steps at 1e-3 left train CE 3.8 and no valid sampled call; at 3e-3 CE is
    # 0.09 by step 290 and 0.007 by 440, where a third of sampled episodes resolve (~3.5 s/step).
    cfg = _debug()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name="sft"),
                               data=dataclasses.replace(cfg.data, seq_len=3072, global_batch_size=2),
                               train=dataclasses.replace(cfg.train, steps=600, lr=3e-3, warmup_steps=10,
                                                         eval_every=120, eval_batches=2))


def _run_cpt(cfg: Config, workdir: pathlib.Path) -> None:
    import jax

    from composer_jax.inference import SamplingParams
    from composer_jax.inference.generate import generate   # the function, not the submodule
    from composer_jax.train.loop import train

    result = train(cfg, workdir, kind="cpt")
    if result.already_finished:
        return
    shown = {k: round(v, 4) for k, v in result.metrics.items()}
    print(f"final metrics: {shown}")
    if result.interrupted:
        return                       # preempted: the checkpoint is saved, exit promptly
    if jax.process_count() == 1:
        tok = result.tokenizer
        prompts = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n",
                   "class Stack:\n    def __init__(self):\n"]
        model = result.model()       # samples on one device: the weights gathered off the mesh
        outs = generate(model, [tok.encode(p) for p in prompts],
                        SamplingParams(temperature=0.0, max_new_tokens=40))
        for p, c in zip(prompts, outs):
            print("-" * 60 + "\n" + p + tok.decode(c.tokens))


def _run_sft(cfg: Config, workdir: pathlib.Path) -> None:
    import json

    from composer_jax.config import to_dict
    from composer_jax.train.loop import train

    cfg, line = _sft_resolved(cfg, workdir)
    print(line)
    tmp = workdir / "config.json.tmp"  # record the resolved source (launch.py has written the same)
    tmp.write_text(json.dumps(to_dict(cfg), indent=2))
    tmp.replace(workdir / "config.json")
    if cfg.data.sft_source == SftSource.ENV_ORACLE:
        _build_env_samples(cfg)
    result = train(cfg, workdir, kind="sft")
    if result.already_finished:
        return
    print({k: round(v, 4) for k, v in result.metrics.items()})


def _sft_resolved(cfg: Config, workdir: pathlib.Path) -> tuple[Config, str]:
    """(cfg with the SFT prompt taken from env.* and a concrete data.sft_source and pool, a line
    saying which source and why): what an sft run records in its config.json."""
    from composer_jax.data.sft import resolve_source

    data = _with_env_prompt(cfg)
    if data.sft_source != SftSource.DOCSTRINGS and not data.sft_pool:
        data = dataclasses.replace(data, sft_pool=str(_default_pool(cfg, workdir)))
    data, line = resolve_source(data)
    return dataclasses.replace(cfg, data=data), line


def _sft_record(cfg: Config, workdir: pathlib.Path) -> Config:
    """The config an sft run records (`_sft_resolved`), for launch.py to compare a rerun with."""
    return _sft_resolved(cfg, workdir)[0]


def _with_env_prompt(cfg: Config) -> DataConfig:
    """cfg.data with the SFT samples' prompt taken from env.prompt_tools / env.declare_tools (the
    settings the RL run then reads back). A data.sft_prompt_tools / data.sft_declare_tools set to
    something else is refused: it would be replaced, not used."""
    data, default = cfg.data, DataConfig()
    env = {"sft_prompt_tools": tuple(cfg.env.prompt_tools),
           "sft_declare_tools": cfg.env.declare_tools}
    for key, value in env.items():
        mine = getattr(data, key)
        if mine != getattr(default, key) and mine != value:
            raise ConfigError(f"data.{key}={mine!r}: the sft experiment sets it from "
                              f"env.{key.removeprefix('sft_')} (now {value!r}); set that instead")
    return dataclasses.replace(data, **env)


def _default_pool(cfg: Config, workdir: pathlib.Path) -> pathlib.Path:
    """Where `sft` looks for a task pool when data.sft_pool is unset: env.pool_dir, else WORKDIR/pool
    (where `env_generate --workdir=WORKDIR` writes it)."""
    from experiments.env import pool_dir

    return pool_dir(cfg, workdir)


def _build_env_samples(cfg: Config) -> None:
    """Runs the oracle episodes with the run's env config (cfg.env: sandbox, limits) into the sample
    cache that the SFT iterator then reads, and says how many samples there are and how many fit."""
    from composer_jax import data
    from composer_jax.agent.episode import run_episode
    from composer_jax.data import sft_env

    corpus = data.build_or_load_corpus(cfg.data)
    tokenizer = data.build_or_load_tokenizer(cfg.data, corpus, cfg.model.vocab_size)
    store = sft_env.build_or_load_env_sft(cfg.data, tokenizer, cfg.env, run_episode)
    info = sft_env.store_info(store)
    fits = int((store.lengths <= cfg.data.seq_len).sum())
    print(f"{info.get('samples', store.num_docs)} oracle samples from {info.get('tasks', '?')} training tasks "
          f"({info.get('skipped', 0)} episodes skipped); {fits} fit in data.seq_len={cfg.data.seq_len} "
          f"(longest {int(store.lengths.max())} tokens; {info.get('trained_tokens', '?')} of "
          f"{info.get('sample_tokens', '?')} tokens trained)")


registry.register("cpt_debug", "tiny model, continued pretraining on a few hundred local files "
                  "(CI)", _debug, _run_cpt, stoppable=True)
registry.register("cpt_small", "the `small` config on the whole local code corpus", _small, _run_cpt,
                  stoppable=True)
registry.register("cpt_32k", "stage 1: kimi_k2_5 continued pretraining at 32k context (pods; "
                  "try --dry_run --set mesh.num_devices=256)", _cpt_32k, _run_cpt, stoppable=True)
registry.register("cpt_256k", "stage 2: YaRN long-context extension to 256k from a cpt_32k run "
                  "(pods; try --dry_run --set mesh.num_devices=256)", _cpt_256k, _run_cpt,
                  stoppable=True)
registry.register("sft", "short SFT on chat-formatted samples, loss on assistant tokens only "
                  "(on CPU its 600 steps take hours: set --config.train.steps)",
                  _sft, _run_sft, stoppable=True, record=_sft_record)
