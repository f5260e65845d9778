"""Model experiments: `model_check` builds a model (fresh, or the weights of `train.init_from`: a
run's WORKDIR or WORKDIR@STEP, pretraining, SFT or RL alike), runs it, and round-trips it through HF
format: WORKDIR/hf holds the exported safetensors (and the run's tokenizer.json), which `eval`,
`generate` and `train.init_from` read as a Hugging Face directory."""
from __future__ import annotations

import pathlib
import time

from composer_jax import registry
from composer_jax.config import Config, tiny


def _config() -> Config:
    return Config(model=tiny())


def _run(cfg: Config, workdir: pathlib.Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from composer_jax.model import count_params, init_model
    from composer_jax.model.hf import load_hf, save_hf
    from composer_jax.runlog import MetricsWriter

    tokenizer_json = None
    if cfg.train.init_from:
        from composer_jax.train.weights import load_weights
        w = load_weights(cfg.train.init_from, cfg)
        model, m, tokenizer_json = w.model(), w.model_cfg, w.tokenizer_path
        print(f"exporting {cfg.train.init_from}" + (f" (step {w.step})" if w.step is not None else ""))
    else:
        m = cfg.model
        model = init_model(m, cfg.seed, cfg.execution, cfg.train.init_std)
    total, active = count_params(m)
    print(f"{m.name}: {total:,} parameters, {active:,} active per token")
    b, t = 2, min(cfg.data.seq_len, 64)
    tokens = jax.random.randint(jax.random.key(cfg.seed), (b, t), 0, m.vocab_size)
    graphdef, state = nnx.split(model)

    @jax.jit
    def loss_fn(state):
        out = nnx.merge(graphdef, state)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(out.logits[:, :-1],
                                                               tokens[:, 1:]).mean()

    t0 = time.time()
    loss = float(loss_fn(state))
    compile_s = time.time() - t0
    t0 = time.time()
    loss = float(loss_fn(state))
    fwd_s = time.time() - t0
    hf_dir = workdir / "hf"
    save_hf(model, hf_dir)
    if tokenizer_json is not None:
        (hf_dir / "tokenizer.json").write_bytes(pathlib.Path(tokenizer_json).read_bytes())
    _, reloaded = load_hf(hf_dir, execution=cfg.execution)
    a = np.asarray(model(tokens).logits)
    r = np.asarray(reloaded(tokens).logits)
    diff = float(np.max(np.abs(a - r)))
    with MetricsWriter(workdir) as w:
        w.write(0, {"loss": loss, "params_total": total, "params_active": active,
                    "hf_roundtrip_max_abs_diff": diff, "compile_s": compile_s, "forward_s": fwd_s})
    print(f"HF checkpoint: {hf_dir}")
    print(f"initial loss {loss:.4f} (ln V = {np.log(m.vocab_size):.4f}); forward {fwd_s * 1e3:.1f} ms "
          f"after a {compile_s:.1f} s compile; HF save/load round trip max |dlogits| = {diff:.3g}")
    if diff != 0.0:
        raise SystemExit(f"HF round trip changed the logits by {diff}")


registry.register("model_check", "build a model, run a forward pass, round-trip it through HF "
                  "safetensors (tiny by default)", _config, _run)
