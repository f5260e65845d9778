"""Shared pytest setup: CPU only, float32 matmuls at full precision, deterministic."""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
# The XLA CPU backend compiles at LLVM -O0 under test: the test programs are tiny, so compiling is
# most of their time, and -O0 compiles them about 40% faster with the same semantics. Subprocesses
# inherit it; scripts that need fake devices append their device count (device_subprocess.py).
os.environ["XLA_FLAGS"] = ("--xla_backend_optimization_level=0 " + os.environ.get("XLA_FLAGS", "")).strip()
# One JAX persistent compilation cache per test run, under the run's cache dir (CI: a fresh
# `.cache` in the clone, so nothing carries over between runs). Many tests and the case scripts
# they start in subprocesses (which inherit the variable) compile the same tiny programs; each is
# compiled once. Programs that compile in under a second are not cached (JAX's default).
if os.environ.get("COMPOSER_JAX_CACHE"):
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                          os.path.join(os.environ["COMPOSER_JAX_CACHE"], "jax_compilation"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
