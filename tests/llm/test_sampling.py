"""Sampling (temperature > 0) through draft trees keeps the base model's distribution.

Every speculative method draws one sample per emitted token, from the base model's own
distribution at that point, in the order `generate_ar` draws them. So with the same seed the
sampled text must be the *same* as autoregressive sampling's: a far stricter check than
comparing histograms, and it fails if any draft token were emitted without being sampled.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from edgestream.llm.baselines import generate_medusa, generate_pld
from edgestream.llm.engine import Sampling, TokenPicker, generate_ar, generate_ss
from edgestream.llm.medusa import MedusaConfig, MedusaHeads
from edgestream.llm.model import Transformer
from edgestream.llm.msa import SpeculativeStreams, StreamConfig
from edgestream.llm.tree import DraftTree, TreeShape
from tests.conftest import tiny_llama

SAMPLINGS = [Sampling(1.0, 1.0, seed) for seed in range(3)] + [
    Sampling(0.7, 0.9, seed) for seed in range(3, 5)
]


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_hf(tiny_llama(max_position=128))


def _randomised(module: torch.nn.Module, std: float) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)
    return module.eval()


@pytest.fixture(scope="module")
def streams(model: Transformer) -> SpeculativeStreams:
    config = StreamConfig(
        3, n_stream_layers=2, adapter_rank=4, next_token_rank=4, draft_vocab_size=0
    )
    return _randomised(SpeculativeStreams(model.config, config), 0.2)


@pytest.fixture(scope="module")
def narrow_streams(model: Transformer) -> SpeculativeStreams:
    """Streams drafting among 50 tokens: the prompts' other tokens reach them only as context
    drafts (`msa.ContextTokens`)."""
    config = StreamConfig(3, n_stream_layers=2, adapter_rank=4, draft_vocab_size=50)
    return _randomised(SpeculativeStreams(model.config, config), 0.2)


@pytest.fixture(scope="module")
def heads(model: Transformer) -> MedusaHeads:
    return _randomised(MedusaHeads(model.config, MedusaConfig(3, 0)), 0.5)


def _prompt(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_sampled_output_equals_ar_sampling_with_the_same_seed(
    model: Transformer,
    streams: SpeculativeStreams,
    narrow_streams: SpeculativeStreams,
    heads: MedusaHeads,
    sampling: Sampling,
) -> None:
    prompt = _prompt(12, sampling.seed) + _prompt(12, sampling.seed, vocab=10) * 2
    ar = generate_ar(model, prompt, 48, sampling=sampling).token_ids
    greedy = generate_ar(model, prompt, 48).token_ids
    assert ar != greedy, "sampling should leave the greedy path (test premise)"
    assert generate_ss(model, streams, prompt, 48, sampling=sampling).token_ids == ar
    assert generate_ss(model, narrow_streams, prompt, 48, sampling=sampling).token_ids == ar
    hybrid = generate_ss(model, streams, prompt, 48, sampling=sampling, lookup_tokens=5)
    assert hybrid.token_ids == ar
    assert generate_pld(model, prompt, 48, sampling=sampling).token_ids == ar
    assert generate_medusa(model, heads, prompt, 48, sampling=sampling).token_ids == ar


def test_low_temperature_drafts_are_accepted(model: Transformer) -> None:
    # A tiny random model loops; near-greedy sampling then accepts whole lookup drafts, so
    # the speculative path is exercised, not just the one token after each pass.
    prompt = _prompt(8, 11)
    sampling = Sampling(temperature=0.05, seed=3)
    pld = generate_pld(model, prompt, 100, sampling=sampling)
    assert pld.token_ids == generate_ar(model, prompt, 100, sampling=sampling).token_ids
    assert pld.mean_accepted > 1.4


def test_tree_acceptance_samples_from_the_target_at_every_node() -> None:
    # Node 0's distribution puts 0.75 on token 5 (a child) and 0.25 on token 9 (no child);
    # node 1 (token 5) is certain to continue with token 7.
    tree = DraftTree([1, 5, 6], [-1, 0, 0], [0, 1, 1])
    logits = torch.full((3, 10), -1e9)
    logits[0, 5], logits[0, 9] = 0.0, -torch.log(torch.tensor(3.0))
    logits[1, 7] = 0.0
    logits[2, 2] = 0.0
    pick = TokenPicker(Sampling(temperature=1.0, seed=0))
    counts: Counter = Counter()
    for _ in range(4000):
        path, token = pick.accept(tree, logits)
        counts[(tuple(path), token)] += 1
    assert set(counts) == {((0, 1), 7), ((0,), 9)}  # token 6's branch is never taken
    assert counts[((0, 1), 7)] / 4000 == pytest.approx(0.75, abs=0.03)


def test_medusa_and_ss_stop_and_budget_exactly_when_sampling(
    model: Transformer, streams: SpeculativeStreams, heads: MedusaHeads
) -> None:
    prompt, sampling = _prompt(10, 5), Sampling(1.0, seed=9)
    free = generate_ar(model, prompt, 40, sampling=sampling).token_ids
    stop = free[15]
    for decode in (
        lambda n, s: generate_ss(model, streams, prompt, n, s, sampling=sampling),
        lambda n, s: generate_medusa(model, heads, prompt, n, s, sampling=sampling),
        lambda n, s: generate_pld(model, prompt, n, s, sampling=sampling),
    ):
        assert decode(7, ()).token_ids == free[:7]
        stopped = decode(40, {stop})
        assert stopped.token_ids == free[: free.index(stop) + 1]
        assert stopped.finish_reason == "stop"


def test_tree_shapes_do_not_change_sampled_output(model: Transformer, heads: MedusaHeads) -> None:
    prompt, sampling = _prompt(10, 2), Sampling(0.8, seed=1)
    ar = generate_ar(model, prompt, 40, sampling=sampling).token_ids
    for shape in (TreeShape(), TreeShape(top_k=(1, 1, 1), max_nodes=4), TreeShape(max_nodes=16)):
        assert (
            generate_medusa(model, heads, prompt, 40, shape=shape, sampling=sampling).token_ids
            == ar
        )
