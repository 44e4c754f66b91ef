"""Writes the sections of the model configs and docs that come from tritonllm/common/request_parameters.py.

`make configs` (python -m tritonllm.launcher.parameter_configs) rewrites them in place; `--check` exits 1 when a
file differs from what the declarations make, and tests/unit/test_request_parameters.py fails the same way.
Each section sits between a BEGIN and an END marker line; everything outside them is written by hand. The
tensorrt_llm face's tensors are copied from llm's config the same way.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from tritonllm.common.request_parameters import PARAMETERS, Parameter

ROOT = Path(__file__).resolve().parents[2]
BEGIN_PREFIX = "BEGIN generated from "
BEGIN = BEGIN_PREFIX + "tritonllm/common/request_parameters.py: edit there, then run `make configs`"
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


LLM_CONFIG = "model_repository/llm/config.pbtxt"
# llm tensors the tensorrt_llm face declares with TensorRT-LLM's types, or does not take (the shim's channel)
NOT_ON_THE_FACE = {"early_stopping", "lora_weights", "mux_open", "mux_channel"}


def llm_tensor_entries(kind: str) -> list[list[str]]:
    """The llm config's `input` or `output` entries, each with the comment lines above it."""
    lines = (ROOT / LLM_CONFIG).read_text().splitlines()
    start = lines.index(f"{kind} [")
    entries, comments = [], []
    for line in lines[start + 1 : lines.index("]", start)]:
        text = line.strip()
        if BEGIN_PREFIX in text or END in text:
            continue
        if text.startswith("#"):
            comments.append(text)
        elif text.startswith("{ name:"):
            name = text.split('"')[1]
            if name not in NOT_ON_THE_FACE and not name.startswith("mux_"):
                entries.append([*comments, text.rstrip(",")])
            comments = []
    return entries


def face_inputs() -> list[str]:
    return _entries(llm_tensor_entries("input"), "  ")


def face_outputs() -> list[str]:
    return _entries(llm_tensor_entries("output"), "  ")


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
    "model_repository/tensorrt_llm/config.pbtxt": [face_inputs, face_outputs],
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
        if BEGIN_PREFIX in lines[i]:
            make = next(sections)
            end = next(j for j in range(i, len(lines)) if END in lines[j])
            out += make() + [lines[end]]
            i = end
        i += 1
    if next(sections, None) is not None:
        raise ValueError(f"{path} lacks a '{BEGIN_PREFIX}' marker")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report the files that differ")
    args = parser.parse_args(argv)
    stale = [path for path in SECTIONS if generated(path) != (ROOT / path).read_text()]
    if args.check:
        for path in stale:
            print(f"{path} differs from tritonllm/common/request_parameters.py: run `make configs`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        (ROOT / path).write_text(generated(path))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
