"""The engine on a CUDA device, against transformers on the same device: greedy output token for token in
float32, bfloat16 no further from float32 than transformers' own bfloat16, seeded sampling that does not depend on
the batch, beams as generate(num_beams) finds them, and every KV block returned.

`make test-gpu` runs these (they fail where no CUDA device is present); `make test` deselects them (marker gpu).
On CUDA the engine runs transformers' modules with the paged attention of paged_attention.py (SDPA over gathered
blocks): none of the CPU's native kernels, so none of the CPU tests reaches this path.
"""

from __future__ import annotations

import pytest
import torch
from unit.test_beam_search import beam_params, end_id_and_bias, hf_beams
from unit.test_engine import check_staggered_greedy, random_prompts, reference, run

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device: make test-gpu needs one, and a CUDA build of torch")
    return torch.device("cuda")


@pytest.fixture(scope="module")
def bfloat16_model_dir(tmp_path_factory):
    """A random Llama with transformers' own initialisation, whose logits bfloat16 can carry: the demo models'
    weights are scaled so that their logits spread (greedy ties are rare), and the load's probe refuses them in
    bfloat16 (their paged logits differ from eager bfloat16 by more than 5% of the largest)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("llama-bfloat16")
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def hf_on(model_dir, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()


def make_engine(model_dir, dtype: str, **overrides) -> LLMEngine:
    settings = dict(num_kv_blocks=256, block_size=4, max_num_seqs=32, max_num_batched_tokens=64)
    return LLMEngine(EngineConfig(str(model_dir), device="cuda", dtype=dtype, **settings | overrides))


def prompt_logprobs(hf_model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt], device=hf_model.device)).logits[0, :-1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].cpu()


def test_float32_greedy_equals_generate_on_the_device(tiny_model_dir, cuda):
    engine = make_engine(tiny_model_dir, "float32", max_num_batched_tokens=48)  # prompts chunked, mixed steps
    assert engine.runner.device.type == "cuda" and engine.runner.decoder_stack is None
    check_staggered_greedy(engine, hf_on(tiny_model_dir, cuda, torch.float32))


def test_a_cached_prefix_gives_the_same_answer(tiny_model_dir, cuda):
    hf_model = hf_on(tiny_model_dir, cuda, torch.float32)
    engine = make_engine(tiny_model_dir, "float32")
    prompt = random_prompts(1, seed=3, max_len=60)[0] + [9] * 30
    first, second = (Sequence(prompt, SamplingParams(max_tokens=16)) for _ in range(2))
    run(engine, [first])
    run(engine, [second])
    assert engine.blocks.prefix_hit_tokens > 0
    assert first.output_ids == second.output_ids == reference(hf_model, prompt, 16)


def test_bfloat16_is_no_further_from_float32_than_transformers_bfloat16(bfloat16_model_dir, cuda):
    """Prompt log-probabilities (every position, the prompt chunked): the engine in bfloat16 against transformers
    in float32, within twice transformers' own bfloat16 error and a floor of bfloat16's rounding."""
    exact = hf_on(bfloat16_model_dir, cuda, torch.float32)
    rounded = hf_on(bfloat16_model_dir, cuda, torch.bfloat16)
    engine = make_engine(bfloat16_model_dir, "bfloat16", max_num_batched_tokens=16)
    assert engine.runner.dtype == torch.bfloat16
    prompts = random_prompts(4, seed=7)
    seqs = [Sequence(p, SamplingParams(max_tokens=1, return_prompt_log_probs=True)) for p in prompts if len(p) > 8]
    run(engine, seqs)
    for seq in seqs:
        truth = prompt_logprobs(exact, seq.prompt_ids)
        theirs = (prompt_logprobs(rounded, seq.prompt_ids) - truth).abs().max().item()
        ours = (torch.tensor(seq.prompt_logprobs) - truth).abs().max().item()
        assert ours <= max(2 * theirs, 0.05), f"engine {ours:.4f}, transformers bfloat16 {theirs:.4f}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_seeded_sampling_does_not_depend_on_the_batch(tiny_model_dir, bfloat16_model_dir, cuda, dtype):
    model_dir = tiny_model_dir if dtype == "float32" else bfloat16_model_dir
    prompt = random_prompts(1, seed=4)[0]
    params = SamplingParams(max_tokens=32, temperature=0.8, top_k=50, top_p=0.9, seed=123)
    alone = Sequence(prompt, params)
    run(make_engine(model_dir, dtype), [alone])
    crowd = [
        Sequence(p, SamplingParams(max_tokens=32, temperature=1.0, seed=i)) for i, p in enumerate(random_prompts(15, 5))
    ]
    together = Sequence(prompt, params)
    run(make_engine(model_dir, dtype), [*crowd[:7], together, *crowd[7:]])
    other_seed = Sequence(prompt, SamplingParams(max_tokens=32, temperature=0.8, top_k=50, top_p=0.9, seed=124))
    run(make_engine(model_dir, dtype), [other_seed])
    assert together.output_ids == alone.output_ids
    assert other_seed.output_ids != alone.output_ids


def test_beams_equal_generate_num_beams(tiny_model_dir, cuda):
    hf_model = hf_on(tiny_model_dir, cuda, torch.float32)
    prompts = random_prompts(3, seed=11, max_len=40)
    engine = make_engine(tiny_model_dir, "float32", max_num_batched_tokens=24)  # beams decode beside prefills
    seqs, expected = [], []
    for prompt in prompts:
        end_id, bias = end_id_and_bias(hf_model, prompt)
        seqs.append(Sequence(prompt, beam_params(end_id, bias, 1.0, False)))
        expected.append(hf_beams(hf_model, prompt, end_id, bias, 1.0, False))
    run(engine, seqs, arrive_every=3)
    for seq, (beams, scores) in zip(seqs, expected, strict=True):
        results = seq.beam.results()
        assert [h.output_ids for h in results] == beams
        assert [h.score for h in results] == pytest.approx(scores, rel=1e-5, abs=1e-4)
    assert engine.blocks.num_free == engine.blocks.num_blocks
