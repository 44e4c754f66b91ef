"""The tiny demo model with chat templates that think, as reasoning models' templates do (written here: no real
reasoning model can be had offline). Weights and tokenizer are tiny's; only chat_template.jinja differs."""

from __future__ import annotations

import shutil
from pathlib import Path

_TURNS = """\
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}
{{- (message.content or '') + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
"""


def _template(generation_prompt: str) -> str:
    """ChatML turns, then the assistant's opening followed by `generation_prompt` (Jinja)."""
    opening = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}" + generation_prompt + "{%- endif %}"
    return _TURNS + opening + "\n"


# Qwen3's way: the model opens <think> itself; enable_thinking=false writes an empty block into the prompt.
QWEN3_STYLE = _template(
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)
# DeepSeek-R1's way: the generation prompt opens the block, the answer starts inside it (thinking=false: closed).
DEEPSEEK_R1_STYLE = _template(
    "{%- if thinking is defined and thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
)
TEMPLATES = {"qwen3": QWEN3_STYLE, "deepseek_r1": DEEPSEEK_R1_STYLE}


def thinking_model(tiny: Path, out: Path, style: str) -> Path:
    """A copy of the tiny model (weights linked, not copied) whose chat template thinks in `style`."""
    out.mkdir(parents=True, exist_ok=True)
    for path in tiny.iterdir():
        target = out / path.name
        if path.suffix == ".safetensors":
            target.symlink_to(path.resolve())
        elif path.name != "chat_template.jinja":
            shutil.copy(path, target)
    (out / "chat_template.jinja").write_text(TEMPLATES[style])
    return out
