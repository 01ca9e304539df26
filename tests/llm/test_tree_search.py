"""The tree simulation must count exactly the passes the decoder makes on the same answers."""

from __future__ import annotations

import pytest
import torch

from edgestream.llm.engine import generate_ar, generate_ss
from edgestream.llm.msa import SpeculativeStreams
from edgestream.llm.train import StreamObjective
from edgestream.llm.tree import TreeShape
from edgestream.llm.tree_search import held_out_drafts, simulate
from tests.conftest import QUESTIONS

SHAPES = [TreeShape(), TreeShape((1, 1, 1), 4), TreeShape((6, 4, 2), 12), TreeShape((2,), 3)]


def _answer_record(lm: object, streams: SpeculativeStreams, prompt_ids: list[int]) -> dict:
    """A distillation record of the model's greedy answer, its states computed in float32."""
    answer = generate_ar(lm.model, prompt_ids, 20).token_ids
    tokens = torch.tensor(prompt_ids + answer)
    with torch.no_grad():
        cache = lm.model.new_cache(len(tokens))
        x, rope, mask = lm.model.prepare(tokens[None], cache)
        for i in range(streams.split):
            x = lm.model.layers[i](x, rope, mask, cache, i)
    return {"tokens": tokens, "prompt_length": len(prompt_ids), "split_hidden": x[0, :-1]}


@pytest.mark.parametrize("context_drafts", [True, False])
def test_simulated_passes_equal_the_decoders(
    trained_tiny_streams: tuple, context_drafts: bool
) -> None:
    lm, streams, _ = trained_tiny_streams
    objective = StreamObjective(lm.model.requires_grad_(False), streams, streams.split)
    prompts = [lm.encode_prompt(q) for q in QUESTIONS]
    records = [_answer_record(lm, streams, p) for p in prompts]
    k = max(max(shape.top_k) for shape in SHAPES)
    drafts = held_out_drafts(objective, records, k, context_drafts=context_drafts)
    accepted_somewhere = False
    for shape in SHAPES:
        decoded_passes = decoded_tokens = 0
        for prompt, record in zip(prompts, records, strict=True):
            answer = len(record["tokens"]) - len(prompt)
            result = generate_ss(
                lm.model, streams, prompt, answer, shape=shape, context_drafts=context_drafts
            )
            assert result.token_ids == record["tokens"][len(prompt) :].tolist()
            decoded_passes += result.forward_passes - 1  # the prefill is not a verification
            decoded_tokens += result.new_tokens - 1  # nor is its token
        walk = simulate(drafts, shape)
        assert (walk.passes, walk.tokens) == (decoded_passes, decoded_tokens), shape
        accepted_somewhere |= walk.tokens_per_pass > 1.1
    assert accepted_somewhere  # the comparison says little if nothing is ever accepted


def test_a_tree_wider_than_the_drafts_is_refused(trained_tiny_streams: tuple) -> None:
    lm, streams, _ = trained_tiny_streams
    objective = StreamObjective(lm.model.requires_grad_(False), streams, streams.split)
    drafts = held_out_drafts(objective, [_answer_record(lm, streams, [5, 6, 7])], k=2)
    with pytest.raises(ValueError, match="top-2 candidates"):
        simulate(drafts, TreeShape((4, 2), 6))


def test_context_drafts_differ_from_vocabulary_drafts(trained_tiny_streams: tuple) -> None:
    """The tiny streams draft among 64 tokens; these answers use tokens outside them that
    their prompts hold, so the two simulations must differ (else the tests above prove little)."""
    lm, streams, _ = trained_tiny_streams
    objective = StreamObjective(lm.model.requires_grad_(False), streams, streams.split)
    records = [_answer_record(lm, streams, lm.encode_prompt(q)) for q in QUESTIONS]
    with_context = held_out_drafts(objective, records, 4)
    without = held_out_drafts(objective, records, 4, context_drafts=False)
    vocabulary = set(streams.draft_vocab.tolist())
    drafted_beyond = {
        t for answer in with_context for t in answer.candidates.flatten().tolist()
    } - vocabulary
    assert drafted_beyond
    assert not {t for a in without for t in a.candidates.flatten().tolist()} - vocabulary
