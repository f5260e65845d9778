"""The Ray weight index is not the only copy (`RayTransport(mirror=True)`): when the index actor
dies, Ray restarts it empty and the publisher refills it from its own copy: by the keeper thread
while nothing is published, or first thing at the next write. Readers then fetch every kept
version bit for bit and publishing goes on."""
import time

import numpy as np

from ray_local import local_ray
from composer_jax.rl.weights import WeightReader, WeightStore, WeightSyncSettings

SETTINGS = WeightSyncSettings(dtype="", full_snapshot_every=2, chunk_elems=500)


def _params(v: int) -> dict:
    rng = np.random.default_rng(v)
    return {"w": rng.standard_normal((40, 30)).astype(np.float32),
            "b": np.full((30,), v, np.float32)}


def _killed(ray, transport):
    """Kills the index actor (Ray restarts it, empty) and waits until the restarted one answers
    (a new generation: the old actor may still answer a call made right after the kill)."""
    old = ray.get(transport._index.get_generation.remote(), timeout=30)
    ray.kill(transport._index, no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ray.get(transport._index.get_generation.remote(), timeout=5) != old:
                return
        except Exception:  # noqa: BLE001 - restarting
            pass
        time.sleep(0.1)
    raise AssertionError("the index actor did not come back")


def test_restarted_index_is_refilled_from_the_publisher():
    with local_ray("rix", namespace="rix") as ray:
        from composer_jax.rl.weights.ray_transport import RayTransport
        pub = RayTransport("rix_index", "rix", mirror=True, keep_s=0.2)
        store = WeightStore(pub, SETTINGS, process_index=0, process_count=1)
        for v in range(3):
            store.publish(v, _params(v))
        before = pub.committed_versions()
        reader = WeightReader(RayTransport("rix_index", "rix"), name="inference")
        assert reader.latest() == 2

        _killed(ray, pub)                           # nothing published: the keeper refills it
        deadline = time.monotonic() + 30
        while reader.latest() != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pub.committed_versions() == before and len(pub.restores) == 1
        got = reader.fetch(2)
        np.testing.assert_array_equal(got["w"], _params(2)["w"])

        pub.close()                                 # no keeper: the next write refills it
        _killed(ray, pub)
        assert reader.latest() is None              # empty until the publisher writes
        store.publish(3, _params(3))
        assert len(pub.restores) == 2 and pub.committed_versions()[-1] == 3
        got = reader.fetch(3)                       # a delta on top of the version it holds
        np.testing.assert_array_equal(got["w"], _params(3)["w"])
        np.testing.assert_array_equal(got["b"], _params(3)["b"])
