"""Writes the sections of the model configs and docs that come from tritonllm/request_parameters.py.

`make configs` (python -m tritonllm.runtime.parameter_configs) rewrites them in place; `--check` exits 1 when a
file differs from what the declarations make, and tests/unit/test_request_parameters.py fails the same way.
Each section sits between a BEGIN and an END marker line; everything outside them is written by hand.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from ..request_parameters import PARAMETERS, Parameter

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "BEGIN generated from tritonllm/request_parameters.py: edit there, then run `make configs`"
END = "END generated"


def _input(name: str, p: Parameter) -> str:
    pbtxt_type = "TYPE_STRING" if p.wire == "BYTES" else f"TYPE_{p.wire}"
    return f'{{ name: "{name}" data_type: {pbtxt_type} dims: [ 1 ] optional: true }}'


def _entries(entries: list[list[str]], indent: str) -> list[str]:
    """Config inputs: the generated block closes its list, so every entry but the last takes a comma."""
    lines = []
    for i, entry in enumerate(entries):
        *comments, last = entry
        lines += [indent + c for c in comments] + [indent + last + ("," if i < len(entries) - 1 else "")]
    return lines


def llm_inputs() -> list[str]:
    def entry(p: Parameter) -> list[str]:
        comment = textwrap.wrap(_description(p), 114, initial_indent="# ", subsequent_indent="# ")
        return [*comment, _input(p.name, p)]

    return _entries([entry(p) for p in PARAMETERS], "  ")


def ensemble_inputs() -> list[str]:
    return _entries([[_input(p.ensemble_name, p)] for p in PARAMETERS], "  ")


def ensemble_llm_map() -> list[str]:
    return [f'      input_map {{ key: "{p.name}" value: "{p.ensemble_name}" }}' for p in PARAMETERS]


def docs_table() -> list[str]:
    rows = [
        "| `llm` tensor | ensemble input | type | default | must be | shim field | what it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in PARAMETERS:
        default = "unset" if p.default is None else str(p.default).lower()
        cells = [f"`{p.name}`", f"`{p.ensemble_name}`", p.wire, default, p.rule.text, p.field, p.doc]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _description(p: Parameter) -> str:
    default = "" if p.default is None else f"; default {str(p.default).lower()}"
    rule = f"; {p.rule.text}" if p.rule.text else ""
    return p.doc + rule + default


# file -> what its sections hold, in the order they appear
SECTIONS: dict[str, list[Callable[[], list[str]]]] = {
    "model_repository/llm/config.pbtxt": [llm_inputs],
    "model_repository/ensemble/config.pbtxt": [ensemble_inputs, ensemble_llm_map],
    "docs/tensors.md": [docs_table],
}


def generated(path: str) -> str:
    """The file's text with each of its sections made anew from the declarations."""
    lines = (ROOT / path).read_text().splitlines()
    out: list[str] = []
    sections = iter(SECTIONS[path])
    i = 0
    while i < len(lines):
        out.append(lines[i])
        if BEGIN in lines[i]:
            make = next(sections)
            end = next(j for j in range(i, len(lines)) if END in lines[j])
            out += make() + [lines[end]]
            i = end
        i += 1
    if next(sections, None) is not None:
        raise ValueError(f"{path} lacks a '{BEGIN}' marker")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report the files that differ")
    args = parser.parse_args(argv)
    stale = [path for path in SECTIONS if generated(path) != (ROOT / path).read_text()]
    if args.check:
        for path in stale:
            print(f"{path} differs from tritonllm/request_parameters.py: run `make configs`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        (ROOT / path).write_text(generated(path))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
