"""Runs the bandit RL program through the real driver (a subprocess target of the fault tests).

    python tests/rl/rl_fake_run.py WORKDIR '{"steps": 12, ...DriverSettings}' '{...BanditProgram kwargs}'
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from composer_jax.rl.driver import DriverSettings, run_rl  # noqa: E402
from composer_jax.rl.program import ProgramSpec  # noqa: E402
from rl_fake_program import MemoryStore  # noqa: E402

if __name__ == "__main__":
    workdir, settings, program = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    summary = run_rl(ProgramSpec("rl_fake_program:make", program), workdir,
                     DriverSettings(progress=False, **settings), MemoryStore())
    print("SUMMARY " + json.dumps({k: v for k, v in summary.items() if k != "inference"}))
