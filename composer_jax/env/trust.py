"""Whether a training run may optimise rewards graded in this machine's sandbox.

On the fallback backend (no bubblewrap) the code being graded runs without isolation: it can reach
the host's files, the network and the grader's processes, so a policy trained on those rewards can
learn to tamper with them. `require_sandboxed_rewards` refuses such a run unless the user opted in
with `env.allow_unsandboxed_rewards=true`; it returns what the run's summary records. Evaluation and
debugging are not checked here: they may use the fallback (with its warning).
"""
from __future__ import annotations

import json
import pathlib
import sys

from composer_jax.env.config import EnvConfig, SandboxBackend
from composer_jax.env.sandbox import bwrap_works
from composer_jax.env.tasks.pool import atomic_write_text
from composer_jax.errors import ConfigError

SANDBOXED = "sandboxed (bubblewrap)"
UNSANDBOXED = "unsandboxed (fallback backend, env.allow_unsandboxed_rewards=true)"


def effective_backend(cfg: EnvConfig) -> SandboxBackend:
    """The backend episodes will use (env.sandbox_backend=auto resolved), without the warning."""
    if cfg.sandbox_backend == SandboxBackend.AUTO:
        return SandboxBackend.BWRAP if bwrap_works() else SandboxBackend.FALLBACK
    return cfg.sandbox_backend


def require_sandboxed_rewards(cfg: EnvConfig, what: str) -> str:
    """For a run training on code graded in the sandbox (`what` names it, e.g. "rl.tasks=coding"):
    ConfigError on the fallback backend without `env.allow_unsandboxed_rewards=true`; otherwise
    SANDBOXED or UNSANDBOXED (for the run's summary; the latter also warns on stderr)."""
    if effective_backend(cfg) != SandboxBackend.FALLBACK:
        return SANDBOXED
    if not cfg.allow_unsandboxed_rewards:
        why = ("env.sandbox_backend=fallback" if cfg.sandbox_backend == SandboxBackend.FALLBACK
               else "env.sandbox_backend=auto found no working bubblewrap")
        raise ConfigError(
            f"{what} trains on rewards graded by running the policy's code, and its episodes "
            f"would run WITHOUT A SANDBOX ({why}): the code could reach the host's files, the "
            f"network and the grader, and the policy would learn to tamper with its reward. "
            f"Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; check with `python "
            f"launch.py --experiment=env_doctor`), or accept the risk with --set "
            f"env.allow_unsandboxed_rewards=true (the run summary then records it as unsandboxed)")
    print(f"WARNING: {what}: training on UNSANDBOXED rewards (env.allow_unsandboxed_rewards=true): "
          f"the policy's code runs without isolation", file=sys.stderr)
    return UNSANDBOXED


def record_in_summary(path: pathlib.Path, sandbox: str) -> None:
    """Adds `"reward_sandbox": sandbox` to the JSON summary file at `path` (atomically)."""
    path = pathlib.Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["reward_sandbox"] = sandbox
    atomic_write_text(path, json.dumps(data, indent=1))
