"""File tools: read_file, list_dir, write_file, delete_file, search_replace.

They run on the host over the workspace copy, through `composer_jax.env.paths.resolve`, and hand
files they create to the sandbox's uid so sandboxed commands can edit them too.
"""
from __future__ import annotations

import os
import pathlib

from composer_jax.env.paths import PathError, display, resolve
from composer_jax.env.tools.result import ToolResult, error

IDENTICAL_STRINGS = "old_string and new_string are identical; nothing to change"  # search_replace's error

MAX_FILE_BYTES = 4 << 20


def _read_text(path: pathlib.Path) -> str:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PathError(f"{path.name} is larger than {MAX_FILE_BYTES >> 20} MiB")
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise PathError(f"{path.name} looks binary")
    return data.decode("utf-8", errors="replace")


def write_text(ws, path: pathlib.Path, text: str) -> None:
    """Writes `text` without following a final symlink; the file belongs to the sandbox uid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    ws.give_to_sandbox(path)


def read_file(ws, args: dict) -> ToolResult:
    path = resolve(ws.root, args["target_file"])
    if not path.is_file():
        return error(f"file not found: {args['target_file']}")
    lines = _read_text(path).splitlines()
    n = len(lines)
    start = args.get("start_line", 1)
    end = args.get("end_line", start + ws.config.read_max_lines - 1)
    if start < 1 or end < start:
        return error(f"bad line range {start}-{end}: need 1 <= start_line <= end_line")
    if n == 0:
        return ToolResult(f"{display(ws.root, path)} is empty")
    if start > n:
        return error(f"start_line {start} is past the end of the file ({n} lines)")
    end = min(end, n, start + ws.config.read_max_lines - 1)
    body = "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(start, end + 1))
    more = f" (truncated; {n - end} more lines)" if end < n else ""
    return ToolResult(f"{display(ws.root, path)}: lines {start}-{end} of {n}{more}\n{body}")


def list_dir(ws, args: dict) -> ToolResult:
    path = resolve(ws.root, args.get("relative_workspace_path", "."))
    if not path.is_dir():
        return error(f"not a directory: {args.get('relative_workspace_path', '.')}")
    entries = []
    for child in sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name)):
        if child.is_symlink():
            entries.append(f"{child.name} -> (symlink)")
        elif child.is_dir():
            entries.append(f"{child.name}/")
        else:
            entries.append(f"{child.name} ({child.stat().st_size} bytes)")
    cap = ws.config.search_max_results * 10
    extra = f"\n... {len(entries) - cap} more" if len(entries) > cap else ""
    return ToolResult(f"{display(ws.root, path)}/\n" + "\n".join(entries[:cap]) + extra
                      if entries else f"{display(ws.root, path)}/ is empty")


def write_file(ws, args: dict) -> ToolResult:
    path = resolve(ws.root, args["file_path"], for_write=True)
    if path.is_dir():
        return error(f"{args['file_path']} is a directory")
    existed = path.exists()
    write_text(ws, path, args["contents"])
    n = args["contents"].count("\n") + (0 if args["contents"].endswith("\n") else 1)
    return ToolResult(f"{'Overwrote' if existed else 'Created'} {display(ws.root, path)} ({n} lines)")


def delete_file(ws, args: dict) -> ToolResult:
    path = resolve(ws.root, args["target_file"], for_write=True)
    if path.is_dir() and not path.is_symlink():
        return error(f"{args['target_file']} is a directory; delete_file removes files only")
    if not path.exists() and not path.is_symlink():
        return error(f"file not found: {args['target_file']}")
    path.unlink()
    return ToolResult(f"Deleted {display(ws.root, path)}")


def search_replace(ws, args: dict) -> ToolResult:
    path = resolve(ws.root, args["file_path"], for_write=True)
    old, new = args["old_string"], args["new_string"]
    if not path.is_file():
        return error(f"file not found: {args['file_path']} (use write_file to create a file)")
    if old == "":
        return error("old_string is empty; give the exact text to replace")
    if old == new:
        return error(IDENTICAL_STRINGS)
    text = _read_text(path)
    count = text.count(old)
    if count == 0:
        hint = " (it matches if whitespace is ignored; copy the exact indentation)" if \
            "".join(old.split()) in "".join(text.split()) else ""
        return error(f"old_string not found in {display(ws.root, path)}{hint}")
    if count > 1 and not args.get("replace_all", False):
        return error(f"old_string occurs {count} times in {display(ws.root, path)}; include more "
                     f"surrounding context to make it unique, or set replace_all")
    write_text(ws, path, text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1))
    line = text[: text.index(old)].count("\n") + 1
    what = f"{count} occurrences" if args.get("replace_all") else f"1 occurrence at line {line}"
    return ToolResult(f"Edited {display(ws.root, path)}: replaced {what}")
