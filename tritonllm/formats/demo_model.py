"""Builds the project's own demo models, since no model hub is reachable here.

Both models share one byte-level BPE tokenizer trained on deterministic synthetic text that mixes English,
CJK and emoji, so multi-byte tokens and byte pieces occur in generations. Weights are random with a fixed
seed; everything goes through `save_pretrained` and comes back through `from_pretrained` like any HF model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
# Single tokens that stay in decoded text (as in Qwen2.5's tokenizer), so tool calls can be parsed from it.
TOOL_CALL_TAGS = ["<tool_call>", "</tool_call>"]

# ChatML with Qwen-style tool rendering: tools go into the system turn, calls come back in <tool_call> tags.
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions. Function signatures are within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, return {"name": <function-name>, "arguments": <args-json-object>} \
within <tool_call></tool_call> tags.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
{{- '\\n<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


@dataclass(frozen=True)
class DemoSpec:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool


DEMO_MODELS = {
    "tiny": DemoSpec("tiny", 128, 384, 2, 4, 2, tie_word_embeddings=True),
    "small": DemoSpec("small", 512, 2048, 8, 8, 8, tie_word_embeddings=False),
}

ENGLISH_WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
    "hot word but what some we can out other were all there when up use your how said an each she which do "
    "their time if will way about many then them write would like so these her long make thing see him two "
    "has look more day could go come did number sound no most people my over know water than call first who "
    "may down side been now find any new work part take get place made live where after back little only "
    "round man year came show every good me give our under name very through just form sentence great think "
    "serve model token batch stream cache block engine request server triton tensor inference latency"
).split()
_CJK = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么"
    "心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现"
    "分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位"
    "因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师"
    "书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及"
)
_EMOJI = "😀😂🥰😎🤔👍🎉🔥✨🚀🌍🍕☕🐍💡❤️👋🙏📚🎵"


def synthetic_corpus(seed: int = 0, lines: int = 6000) -> list[str]:
    """Deterministic text with English words, CJK runs, emoji, digits and punctuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        parts = []
        for _ in range(rng.randint(4, 16)):
            kind = rng.random()
            if kind < 0.6:
                word = rng.choice(ENGLISH_WORDS)
                parts.append(word.capitalize() if rng.random() < 0.1 else word)
            elif kind < 0.85:
                parts.append("".join(rng.choice(_CJK) for _ in range(rng.randint(1, 6))))
            elif kind < 0.93:
                parts.append(rng.choice(_EMOJI))
            else:
                parts.append(str(rng.randint(0, 9999)))
        out.append(" ".join(parts) + rng.choice([".", "!", "?", ",", "。", "！", ""]))
    return out


def train_tokenizer(progress=print):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    progress(f"training byte-level BPE tokenizer (vocab {VOCAB_SIZE})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(), trainer)
    tok.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_CALL_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "</s>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def build_model(spec: DemoSpec, tokenizer, out_dir: Path, progress=print) -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # A wide init spreads the logits of random weights, so greedy argmax is far from ties and the
        # token-for-token oracle against transformers is not at the mercy of float summation order.
        initializer_range=0.25,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    progress(f"model '{spec.name}': {n_params / 1e6:.2f}M parameters")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    target = out_dir / spec.name
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    progress(f"wrote {target}")
    return target


def check_roundtrip(model_dir: Path) -> None:
    """Loads the saved tokenizer back the ordinary way; transformers 5 may rebuild tokenizers by model type."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    sample = " Hello 你好 😀 café 1234"
    ids = tok.encode(sample, add_special_tokens=False)
    if tok.decode(ids) != sample:
        raise RuntimeError(f"tokenizer in {model_dir} does not round-trip: {tok.decode(ids)!r}")


def build_demo_models(out_dir: Path, names: list[str] | None = None, progress=print) -> list[Path]:
    names = names or list(DEMO_MODELS)
    unknown = set(names) - set(DEMO_MODELS)
    if unknown:
        raise ValueError(f"unknown demo model(s) {sorted(unknown)}; choose from {sorted(DEMO_MODELS)}")
    tokenizer = train_tokenizer(progress)
    paths = []
    for i, name in enumerate(names, 1):
        progress(f"[{i}/{len(names)}] building {name}")
        path = build_model(DEMO_MODELS[name], tokenizer, out_dir, progress)
        check_roundtrip(path)
        paths.append(path)
    return paths
