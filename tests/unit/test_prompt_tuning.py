"""P-tuning: prompt ids from the vocabulary size on select rows of the request's embedding table."""

from __future__ import annotations

import torch
from oracles import prompt_tuned_greedy

from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

from .test_engine import make_engine, run

VOCAB = 4096


def test_virtual_tokens_equal_generate_with_the_same_embeddings(tiny_model_dir, hf_model):
    table = torch.randn(4, hf_model.config.hidden_size, generator=torch.Generator().manual_seed(5))
    prompt = [VOCAB, VOCAB + 1, VOCAB + 2, VOCAB + 3, 17, 250, 33]
    expected = prompt_tuned_greedy(hf_model, table, prompt, 12)
    seqs = [Sequence(prompt, SamplingParams(max_tokens=12), prompt_table=table)]
    plain = Sequence(prompt[4:] + [5], SamplingParams(max_tokens=12))  # shares the batch, no table
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=5)  # the virtual tokens span chunks
    run(engine, [*seqs, plain])
    assert seqs[0].output_ids == expected
    assert engine.blocks.num_free == engine.blocks.num_blocks


def test_tables_keep_their_blocks_out_of_the_prefix_cache(tiny_model_dir):
    prompt = [VOCAB + i % 2 for i in range(40)]
    engine = make_engine(tiny_model_dir)
    first = Sequence(prompt, SamplingParams(max_tokens=2), prompt_table=torch.zeros(2, 128))
    second = Sequence(prompt, SamplingParams(max_tokens=2), prompt_table=torch.ones(2, 128))
    run(engine, [first])
    run(engine, [second])
    assert engine.blocks.prefix_hit_tokens == 0
