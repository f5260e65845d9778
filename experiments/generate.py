"""`generate`: sample completions from a fresh model, a run's checkpoint (pretraining, SFT or
RL: `WORKDIR` or `WORKDIR@STEP`) or a Hugging Face checkpoint directory and print them as text
with their speed; with MTP heads, also speculative decoding's acceptance and speed-up.

    python launch.py --experiment=generate --workdir=W [--set train.init_from=RUN_OR_HF_DIR]
        [--set eval.max_new_tokens=64 --set eval.temperature=0.8 --set seed=1]
        [--set eval.show_token_ids=true]     # also print the token ids

Prompts: code prompts for a code model; a run that records its chat prompts (an RL run's
`prompts.json`) is prompted with those. A fresh model has no tokenizer: token ids only.
"""
from __future__ import annotations

import pathlib

from composer_jax import registry
from composer_jax.config import Config, EvalConfig, small

NUM_PROMPTS = 4
PROMPT_LEN = 16
SPEC_DEPTH = 1


def _config() -> Config:
    return Config(model=small(), eval=EvalConfig(max_new_tokens=48, temperature=0.0))


CODE_PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\n\n\ndef list_python_files(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "    def __repr__(self):\n        return ",
]


def _load(cfg: Config):
    """(model, tokenizer or None) from train.init_from: a training run's workdir, an HF checkpoint
    dir, or '' for a fresh model (`composer_jax.train.weights.load_weights`)."""
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.train.weights import load_weights
    w = load_weights(cfg.train.init_from, cfg)
    if w.kind == "fresh":
        print(f"fresh {cfg.model.name} model (seed {cfg.seed}); set train.init_from=HF_DIR or a "
              f"training run's workdir to load one")
    else:
        at = f" at step {w.step}" if w.step is not None else ""
        print(f"loaded {cfg.train.init_from}{at} ({w.model_cfg.name}, "
              f"mtp_depth={w.model_cfg.mtp_depth})")
    tok = load_tokenizer(w.tokenizer_path) if w.tokenizer_path else None
    return w.model(), tok, _run_prompts(cfg.train.init_from)


def _run_prompts(source: str) -> list | None:
    """The prompts a run recorded for sampling it (WORKDIR/prompts.json: a list whose items are a
    text or a chat, a list of {"role", "content"} messages, e.g. an RL run's task prompts), or
    None."""
    import json

    from composer_jax.train.run_checkpoint import parse_run_source
    if not source:
        return None
    path = parse_run_source(source)[0] / "prompts.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _run(cfg: Config, workdir: pathlib.Path) -> None:
    import dataclasses

    import numpy as np
    from flax import nnx

    from composer_jax.inference import SamplingParams
    from composer_jax.inference.timing import timed_generation, tokens_per_second
    from composer_jax.runlog import MetricsWriter

    model, tokenizer, run_prompts = _load(cfg)
    mcfg = model.cfg
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(cfg.seed)
    stop = ()
    if tokenizer is not None and run_prompts:
        from composer_jax.data import special_tokens as st
        from composer_jax.data.chat import encode_prompt
        prompts = [encode_prompt(tokenizer, p) if isinstance(p, list) else tokenizer.encode(p)
                   for p in run_prompts[:NUM_PROMPTS]]
        if any(isinstance(p, list) for p in run_prompts) and tokenizer.token_to_id(st.IM_END) is not None:
            stop = (tokenizer.token_to_id(st.IM_END),)      # a chat reply ends at <|im_end|>
    elif tokenizer is not None:
        prompts = [tokenizer.encode(p)[:PROMPT_LEN] for p in CODE_PROMPTS[:NUM_PROMPTS]]
    else:
        prompts = [[int(t) for t in rng.integers(0, mcfg.vocab_size, PROMPT_LEN)]
                   for _ in range(NUM_PROMPTS)]
    params = SamplingParams(temperature=cfg.eval.temperature, max_new_tokens=cfg.eval.max_new_tokens,
                            seed=cfg.seed, stop_tokens=stop)
    # the engine's knobs from `--set inference.*`; slots and context sized for these prompts
    ecfg = dataclasses.replace(cfg.inference, max_batch=NUM_PROMPTS,
                               max_len=max(len(p) for p in prompts) + params.max_new_tokens + 1,
                               seed=cfg.seed)
    outs, secs, _ = timed_generation(graphdef, state, prompts, params, ecfg)
    tps = tokens_per_second(outs, secs)
    for p, c in zip(prompts, outs):
        stats = f"({len(c.tokens)} tokens, {c.finish_reason}; mean logprob " \
                f"{np.mean(c.raw_logprobs):.3f})"
        if tokenizer is not None:
            print("-" * 60 + f"\nprompt:     {tokenizer.decode(p)!r}\ncompletion: "
                  f"{tokenizer.decode(c.tokens)!r}\n  {stats}")
            if cfg.eval.show_token_ids:
                print(f"  prompt ids {p}\n  completion ids {list(c.tokens)}")
        else:
            print(f"prompt ids {p[:8]}... -> completion ids {list(c.tokens)} {stats}")
    print(f"plain decoding: {tps:.1f} tokens/s (batch {NUM_PROMPTS}, {len(outs[0].tokens)} tokens)")
    metrics = {"tokens_per_sec": tps}
    if mcfg.mtp_depth > 0:
        depth = min(SPEC_DEPTH, mcfg.mtp_depth)
        souts, ssecs, eng = timed_generation(graphdef, state, prompts, params,
                                             dataclasses.replace(ecfg, spec_depth=depth))
        stps = tokens_per_second(souts, ssecs)
        m = eng.speculation_metrics()
        same = all(a.tokens == b.tokens for a, b in zip(outs, souts))
        print(f"speculative decoding (depth {depth}): {stps:.1f} tokens/s, speed-up "
              f"{stps / tps:.2f}x, mean accepted length {m['mean_accepted_length']:.3f}, "
              f"acceptance per depth {[round(x, 3) for x in m['acceptance_per_depth']]}"
              + (f", greedy outputs identical: {same}" if params.temperature == 0 else ""))
        metrics.update(spec_tokens_per_sec=stps, spec_speedup=stps / tps,
                       mean_accepted_length=m["mean_accepted_length"])
    with MetricsWriter(workdir) as w:
        w.write(0, metrics)


registry.register("generate", "sample completions (a fresh model, or train.init_from= an HF dir or "
                  "a run WORKDIR[@STEP]) with "
                  "tokens/s and MTP speculative-decoding acceptance/speed-up", _config, _run)
