"""The processes the kill fuzz (test_weight_store_fuzz.py) SIGKILLs at random points, and the
deterministic weights they publish.

    python weight_fuzz_worker.py publish KIND WHERE EPOCH   # publishes latest+1, latest+2, ... forever
    python weight_fuzz_worker.py fetch KIND WHERE           # fetches the latest and verifies it, forever
    python weight_fuzz_worker.py append DIR                 # appends admitted/consumed rows, forever

KIND is "tensorstore" (WHERE: a directory) or "ray" (WHERE: the cluster address). Each line of
stdout is flushed: "READY", "PUB v" (v is committed), "OK v" (v fetched and bit-exact),
"RETRY msg" (a legitimate WeightStoreError: nothing published yet, GC outran the reader),
"CORRUPT msg" (a corruption error: the fuzz fails), "APP i" (row i is durable).
No JAX is imported (plain dicts of numpy arrays).

Every publisher restart is a new EPOCH with another tensor shape, set of tensors, chunking, dtype
and snapshot period, so a torn version of the previous epoch is republished with another layout.
"""
import sys
import time

import numpy as np

RAY_NAME, RAY_NAMESPACE = "weight_fuzz", "weight_fuzz"


def settings_for(epoch: int):
    from composer_jax.rl.weights import WeightSyncSettings
    return WeightSyncSettings(full_snapshot_every=2 + epoch % 3,
                              chunk_elems=(256, 700, 1000)[epoch % 3],
                              dtype=("bfloat16", "", "float16")[epoch % 3], threads=1)


def params(epoch: int, v: int) -> dict:
    """Version v of epoch `epoch`: a fixed base plus a sparse perturbation drawn from (epoch, v)."""
    rng = np.random.default_rng([epoch])
    shape = (48, 40) if epoch % 2 else (40, 24)
    base = rng.normal(0, .02, shape).astype(np.float32)
    bias = rng.normal(0, 1, (16,)).astype(np.float32)
    r = np.random.default_rng([epoch, v])
    w = (base + (r.random(shape) < .05) * r.normal(0, 1e-2, shape)).astype(np.float32)
    out = {"w": w, "norm": {"bias": (bias + r.normal(0, 1e-3, 16)).astype(np.float32)},
           "meta": np.array([epoch, v], np.int64)}
    if epoch % 2 == 0:                       # a tensor that exists only in even epochs
        out["x"] = r.normal(size=(13,)).astype(np.float32)
    return out


def shipped(epoch: int, v: int) -> dict:
    """What a reader must get back for (epoch, v): the inference copy of params(epoch, v)."""
    import ml_dtypes
    target = settings_for(epoch).dtype
    p = params(epoch, v)
    flat = {"w": p["w"], "norm/bias": p["norm"]["bias"], "meta": p["meta"]}
    if "x" in p:
        flat["x"] = p["x"]
    dt = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}.get(target)
    return {k: (x.astype(dt) if dt is not None and x.dtype == np.float32 and k != "norm/bias"
                else x) for k, x in flat.items()}


def check(flat: dict) -> int:
    """Asserts `flat` is bit-exact what (epoch, v) in its meta tensor publishes; returns v."""
    epoch, v = (int(x) for x in flat["meta"])
    want = shipped(epoch, v)
    assert sorted(flat) == sorted(want), (sorted(flat), sorted(want))
    for k, x in want.items():
        got = flat[k]
        assert got.dtype == x.dtype and got.shape == x.shape, (k, got.dtype, got.shape)
        assert np.array_equal(got.reshape(-1).view(np.uint8), x.reshape(-1).view(np.uint8)), k
    return v


def open_transport(kind: str, where: str):
    if kind == "tensorstore":
        from composer_jax.rl.weights.tensorstore_transport import TensorStoreTransport
        return TensorStoreTransport(where)
    if kind == "ray":
        import ray
        ray.init(address=where, namespace=RAY_NAMESPACE, log_to_driver=False,
                 configure_logging=False)
        from composer_jax.rl.weights.ray_transport import RayTransport
        return RayTransport(RAY_NAME, RAY_NAMESPACE)
    raise SystemExit(f"unknown transport kind {kind!r}")


def _say(*words) -> None:
    print(*words, flush=True)


def publish(kind: str, where: str, epoch: int) -> None:
    from composer_jax.rl.weights import WeightPublisher
    t = open_transport(kind, where)
    pub = WeightPublisher(t, settings_for(epoch), process_index=0, process_count=1)
    committed = t.committed_versions()
    v = committed[-1] + 1 if committed else 0
    _say("READY")
    while True:
        pub.publish(v, params(epoch, v))
        _say("PUB", v)
        v += 1


def fetch(kind: str, where: str) -> None:
    from composer_jax.rl.weights import CorruptWeightsError, WeightReader, WeightStoreError
    t = open_transport(kind, where)
    reader = WeightReader(t)
    _say("READY")
    n = 0
    while True:
        n += 1
        if n % 2 == 0:
            reader = WeightReader(t)           # a late joiner: rebuilds from snapshots
        try:
            _say("OK", check(reader.fetch()))
        except CorruptWeightsError as e:
            _say("CORRUPT", repr(e).replace("\n", " "))
            raise SystemExit(3)
        except WeightStoreError as e:
            _say("RETRY", repr(e).replace("\n", " "))
            time.sleep(0.005)


def append(root: str) -> None:
    from composer_jax.rl.stream import RolloutLog, group_name
    log = RolloutLog(root)
    i = max((row["index"] for row in log.admitted().values()), default=-1) + 1
    _say("READY")
    while True:
        log.append_admitted(group_name(i), f"t{i}", i)
        if i % 3 == 0:
            log.append_consumed(i, [group_name(i)], [f"{group_name(i)}-s000"])
        _say("APP", i)
        i += 1


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"publish": lambda k, w, e: publish(k, w, int(e)), "fetch": fetch, "append": append}[cmd](*args)
