"""The coding-assistant tools (names and schemas in `schema.TOOL_SPECS`) and their dispatcher."""
from __future__ import annotations

from composer_jax.env.paths import PathError
from composer_jax.env.tools.files import delete_file, list_dir, read_file, search_replace, write_file
from composer_jax.env.tools.result import ToolResult, error
from composer_jax.env.tools.schema import TOOL_NAMES, TOOL_SPECS, declared_specs, validate_arguments
from composer_jax.env.tools.search import file_search, grep_search
from composer_jax.env.tools.semantic import codebase_search
from composer_jax.env.tools.shell import finish, run_terminal_cmd

TOOLS = {
    "read_file": read_file, "list_dir": list_dir, "grep_search": grep_search,
    "file_search": file_search, "codebase_search": codebase_search,
    "search_replace": search_replace, "write_file": write_file, "delete_file": delete_file,
    "run_terminal_cmd": run_terminal_cmd, "finish": finish,
}
assert tuple(TOOLS) == TOOL_NAMES


def dispatch(ws, name, arguments) -> ToolResult:
    """Validates and runs one call; malformed calls and path/OS errors come back as error results."""
    problem = validate_arguments(name, arguments)
    if problem is not None:
        return error(problem)
    try:
        return TOOLS[name](ws, arguments)
    except PathError as exc:
        return error(str(exc))
    except (OSError, UnicodeError) as exc:
        return error(f"{name} failed: {type(exc).__name__}: {exc}")


__all__ = ["TOOLS", "TOOL_NAMES", "TOOL_SPECS", "declared_specs", "ToolResult", "dispatch", "error",
           "validate_arguments"]
