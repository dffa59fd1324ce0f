#!/usr/bin/env python3
"""Rewrites the --help blocks of docs/cli.md from the binary.

Each block follows a marker line `<!-- help: COMMAND -->` (COMMAND empty for the top level, else e.g. `serve` or
`bench gemm`) and is the output of `fp4moe COMMAND --help`, the binary's path in its Usage line written `fp4moe`.
tests/tools/test_cli_docs.cpp checks that every command has a marker and that each block equals the binary's help,
so a flag added without this run fails the suite.

Usage: scripts/update_cli_docs.py [build/fp4moe]
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "cli.md"
MARKER = re.compile(r"^<!-- help: ?(.*?) -->$")


def help_text(binary, command):
    args = [binary] + (command.split() if command else []) + ["--help"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return re.sub(r"^Usage: \S+", "Usage: fp4moe", out, count=1, flags=re.M)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build" / "fp4moe")
    lines = DOC.read_text().split("\n")
    out, i, seen = [], 0, set()
    while i < len(lines):
        out.append(lines[i])
        m = MARKER.match(lines[i])
        i += 1
        if not m:
            continue
        command = m.group(1).strip()
        seen.add(command)
        if i >= len(lines) or lines[i] != "```":
            sys.exit(f"docs/cli.md: the marker for '{command}' is not followed by a ``` block")
        end = lines.index("```", i + 1)
        out += ["```"] + help_text(binary, command).rstrip("\n").split("\n") + ["```"]
        i = end + 1
    DOC.write_text("\n".join(out))
    print(f"docs/cli.md: {len(seen)} help blocks rewritten")


if __name__ == "__main__":
    main()
