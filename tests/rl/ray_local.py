"""A throwaway local Ray cluster for the weight-store tests (skips the test when Ray cannot start)."""
import contextlib
import shutil
import tempfile

import pytest


@contextlib.contextmanager
def local_ray(prefix: str, **init_kwargs):
    """`ray.init` on 1 CPU with a short temp dir (Ray's socket paths must stay short), yielding
    the `ray` module; shut down and removed on exit. `init_kwargs` go to `ray.init` (namespace)."""
    ray = pytest.importorskip("ray", reason="ray is not installed")
    if ray.is_initialized():
        ray.shutdown()
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=tmp,
                 configure_logging=False, **init_kwargs)
    except Exception as e:  # noqa: BLE001 - any failure to start a local cluster
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"Ray cannot start here: {e!r}")
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
