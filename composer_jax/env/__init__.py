"""The agent environment: sandbox, tools, tool-call protocol, tasks, rewards, episodes.

Pure Python + numpy; importing this package never imports JAX (environment workers stay light).
Main entry points:
  open_workspace(directory)       a sandboxed copy-on-write workspace; `.call(tool, args)`
  EnvConfig                       all limits, caps, generation settings and reward weights
  composer_jax.env.protocol       chat template, special tokens, tool-call parser
  (the episode loop is composer_jax.agent.episode; env imports nothing from agent/rl/train/model)
  composer_jax.env.rewards        reward components
  composer_jax.env.grading        the verdict, computed outside the graded test process
  composer_jax.env.tasks          offline task generation and the task pool
"""
from composer_jax.env.config import EnvConfig, SandboxBackend, ShellMode, Split
from composer_jax.env.tools import TOOL_NAMES, TOOL_SPECS, ToolResult
from composer_jax.env.workspace import Workspace, open_workspace

__all__ = ["EnvConfig", "SandboxBackend", "ShellMode", "Split", "TOOL_NAMES", "TOOL_SPECS",
           "ToolResult", "Workspace", "open_workspace"]
