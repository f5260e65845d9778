"""Where the `small` config's train step time goes (issue 19): full step vs its parts, interleaved.

    python benchmarks/small_parts.py [--repeats 5]
    python benchmarks/small_parts.py --profile /tmp/small_prof    # per-XLA-op profile of the step
"""
from __future__ import annotations
import argparse, os, pathlib, statistics, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import jax, jax.numpy as jnp, numpy as np, optax  # noqa: E402
from composer_jax.config import Config, TrainConfig, small  # noqa: E402
from composer_jax.data.config import DataConfig  # noqa: E402
from composer_jax.model import moe  # noqa: E402
from composer_jax.quant import grouped  # noqa: E402
from composer_jax.train import losses  # noqa: E402
from composer_jax.train.step import build_fresh  # noqa: E402
sys.path.insert(0, str(pathlib.Path(__file__).parent))
from train_bench import _batch  # noqa: E402

B, T = 16, 256


class Step:
    def __init__(self, cfg):
        self.fns, self.state = build_fresh(cfg)
        m = cfg.model
        self.batches = [_batch(B, T, m.vocab_size, m.mtp_depth, i) for i in range(3)]
        self.i = 0

    def __call__(self):
        self.state, m = self.fns.train_step(self.state, self.batches[self.i % 3]); self.i += 1
        return m


def parts(cfg, step):
    m = cfg.model
    n, d, e, f, k = B * T, m.hidden_size, m.num_routed_experts, m.moe_intermediate_size, m.num_experts_per_tok
    ks = jax.random.split(jax.random.key(0), 8)
    x = jax.random.normal(ks[0], (n, d))
    idx = jax.random.randint(ks[1], (n, k), 0, e)   # (duplicates possible; cost-wise fine)
    wts = jax.random.uniform(ks[2], (n, k))
    wg = jax.random.normal(ks[3], (e, d, f)) * .02
    wu = jax.random.normal(ks[4], (e, d, f)) * .02
    wd = jax.random.normal(ks[5], (e, f, d)) * .02
    from composer_jax.model.layers import Ctx
    ctx = type("C", (), {"dtype": jnp.float32, "fmt": "bf16"})()
    # (routing arrays are arguments: as closure constants XLA would constant-fold the sort)
    def moe_loss(x, wg, wu, wd, idx, wts):
        return jnp.sum(moe.dispatch_ragged(x, idx, wts, wg, wu, wd, ctx) ** 2)
    moe_fb = jax.jit(jax.value_and_grad(moe_loss, (0, 1, 2, 3)))
    xs = jax.random.normal(ks[6], (n * k, d))
    gs = jnp.bincount(idx.reshape(-1), length=e).astype(jnp.int32)
    def gmm_loss(xs, wg, gs):
        return jnp.sum(grouped.grouped_matmul(xs, wg, gs) ** 2)
    gmm_fb = jax.jit(jax.value_and_grad(gmm_loss, (0, 1)))
    v = m.vocab_size
    w = jax.random.normal(ks[7], (d, v)) * .02
    h = x.reshape(B, T, d)
    tg = idx[:, 0].reshape(B, T) % v
    mask = jnp.ones((B, T))
    head = jax.jit(jax.value_and_grad(lambda h, w: losses.fused_head_ce(h, w, tg, mask, compute_dtype=jnp.float32)[0], (0, 1)))
    params = jax.tree.map(jnp.copy, step.state.params)
    opt_state = jax.tree.map(jnp.copy, step.state.opt_state)
    tx = step.fns.tx
    def opt(p, o, g):
        u, o = tx.update(g, o, p); return optax.apply_updates(p, u), o, optax.global_norm(g)
    opt_jit = jax.jit(opt); grads = jax.tree.map(lambda a: a * 1e-3, params)
    dense_fb = jax.jit(jax.value_and_grad(lambda x, w1, w2: jnp.sum((jax.nn.silu(x @ w1) @ w2) ** 2), (0, 1, 2)))
    w1 = jax.random.normal(ks[0], (d, m.dense_intermediate_size)) * .02
    w2 = jax.random.normal(ks[1], (m.dense_intermediate_size, d)) * .02
    from flax import nnx
    from composer_jax.model.attention import MLA
    from composer_jax.model.layers import Ctx as RealCtx, ParamInit, RMSNorm
    from composer_jax.model import router as router_lib
    rctx = RealCtx(cfg=m, execution=cfg.execution)
    mla = MLA(m, ParamInit(), nnx.Rngs(0))
    gdef, mst = nnx.split(mla)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T)); seg = jnp.ones((B, T), jnp.int32)
    def attn_loss(st, h):
        return jnp.sum(nnx.merge(gdef, st)(h, pos, seg, rctx) ** 2)
    attn_fb = jax.jit(jax.value_and_grad(attn_loss, (0, 1)))
    wr = jax.random.normal(ks[6], (d, e)) * .02; rb = jnp.zeros((e,))
    def router_loss(h, wr):
        i_, w_, s_ = router_lib.route(h.reshape(-1, d) @ wr, rb, m)
        return jnp.sum(w_ ** 2)
    router_fb = jax.jit(jax.value_and_grad(router_loss, (0, 1)))
    norm = RMSNorm(d, m, ParamInit()); ngdef, nst = nnx.split(norm)
    norm_fb = jax.jit(jax.value_and_grad(lambda st, h: jnp.sum(nnx.merge(ngdef, st)(h) ** 2), (0, 1)))
    return {
        "MLA attention fwd+bwd (1 layer; x5 in step)": lambda: attn_fb(mst, h),
        "router (matmul+sigmoid+group top-k) fwd+bwd (1 layer; x4)": lambda: router_fb(h, wr),
        "RMSNorm fwd+bwd (1; ~x12)": lambda: norm_fb(nst, h),
        f"MoE dispatch_ragged fwd+bwd (1 layer; x{m.num_layers - m.first_k_dense + m.mtp_depth} in step)": lambda: moe_fb(x, wg, wu, wd, idx, wts),
        "  of which: 1 grouped matmul fwd+bwd (x3 per layer)": lambda: gmm_fb(xs, wg, gs),
        "LM head + CE fwd+bwd (fused, f32; x2 with MTP)": lambda: head(h, w),
        "optimizer (clip+AdamW+apply)": lambda: opt_jit(params, opt_state, grads),
        "dense MLP fwd+bwd (1 layer)": lambda: dense_fb(x, w1, w2),
    }


def measure(p, repeats):
    for fn in p.values():
        jax.block_until_ready(fn())
    t = {k: [] for k in p}
    for _ in range(repeats):
        for k, fn in p.items():
            s = time.perf_counter(); jax.block_until_ready(fn()); t[k].append(time.perf_counter() - s)
    return {k: statistics.median(v) for k, v in t.items()}


CATEGORIES = [  # (name, regex on the HLO op_name metadata), first match wins
    ("MoE expert matmuls (jbk,jkn)", r"jbk,jkn"),
    ("MoE gathers/scatters, routing sort", r"gather|scatter|_take|argsort|sort|cumsum|searchsorted|bincount"),
    ("attention core (logits, softmax, PV)", r"bhtd|bhts|bhdt|softmax|reduce_max|_where|bthd,bshd|bhts,bshd"),
    ("latent expand / head projections", r"bsc,chd|btc,chd|bthv,hvd|btd,dhk"),
    ("other matmuls (head, MLPs, projections)", r"dot_general|dot"),
    ("SwiGLU elementwise", r"silu"),
]


def profile(step, out_dir: str, steps: int = 2, top: int = 25):
    """Per-XLA-op time of the compiled train step (jax.profiler's perfetto trace: one event per
    executed thunk), mapped to the jax op names in the compiled HLO and grouped by CATEGORIES.
    Sums of op times exceed the wall time a little (the two cores run some thunks in parallel)."""
    import collections, glob, gzip, json, re
    b = step.batches[0]
    hlo = step.fns.train_step.lower(step.state, b).compile().as_text()
    info = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ", line)
        if m:
            op = re.search(r'op_name="([^"]*)"', line)
            info[m.group(1)] = (m.group(2)[:40], op.group(1) if op else "")
    jax.profiler.start_trace(out_dir, create_perfetto_trace=True)
    for _ in range(steps):
        jax.block_until_ready(step())
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(os.path.join(out_dir, "plugins/profile/*/perfetto_trace.json.gz")))[-1]
    events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e["name"] in info and not e["name"].startswith("while"):
            per_op[e["name"]] += e["dur"] / 1e3 / steps
    total = sum(per_op.values())
    cats = collections.Counter()
    for name, ms in per_op.items():
        op = info[name][1]
        cat = next((c for c, pat in CATEGORIES if re.search(pat, op)), "other elementwise/copies")
        cats[cat] += ms
    print(f"sum of XLA op times: {total:.0f} ms/step (load {os.getloadavg()[0]:.1f})")
    for c, ms in cats.most_common():
        print(f"  {c:45s} {ms:8.1f} ms {ms / total:6.1%}")
    print(f"top {top} ops:")
    for name, ms in per_op.most_common(top):
        print(f"  {ms:7.1f} ms  {name:32s} {info[name][0]:40s} {info[name][1][-70:]}")


def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", metavar="DIR", help="profile the full step per XLA op instead")
    a = ap.parse_args()
    cfg = Config(model=small(), data=DataConfig(global_batch_size=B, seq_len=T), train=TrainConfig(steps=1000, warmup_steps=10))
    step = Step(cfg)
    if a.profile:
        for _ in range(2):
            jax.block_until_ready(step())
        return profile(step, a.profile)
    p = {"full train step": step}; p.update(parts(cfg, step))
    r = measure(p, a.repeats)
    full = r["full train step"]
    print(f"small: batch {B}x{T}, median of {a.repeats} interleaved, load {os.getloadavg()[0]:.1f}")
    for k, s in r.items():
        print(f"  {k:70s} {s*1e3:8.1f} ms ({s/full:5.1%})")

if __name__ == "__main__":
    main()
