"""Speculative Streaming: lossless with untrained streams, trees, masks, stopping, weights I/O."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from edgestream.llm.engine import generate_ar, generate_ss
from edgestream.llm.int8 import int8_available
from edgestream.llm.model import Transformer, can_pack_weights
from edgestream.llm.msa import (
    DraftHead,
    MergedStreamLayer,
    SpeculativeStreams,
    StreamAdapter,
    StreamConfig,
    load_streams,
    save_streams,
    ss_forward,
    stream_mask,
    stream_pass,
)
from edgestream.llm.tree import DraftTree, TreeShape, accept, build_tree, graft_chain, tree_mask
from tests.conftest import tiny_llama


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_hf(tiny_llama(max_position=128))


def _random_streams(
    model: Transformer, next_token_rank: int, ffn_rank: int = 0
) -> SpeculativeStreams:
    torch.manual_seed(0)
    config = StreamConfig(
        n_streams=3,
        n_stream_layers=2,
        adapter_rank=4,
        next_token_rank=next_token_rank,
        draft_vocab_size=200 if next_token_rank else 0,  # both kinds of draft head
        ffn_rank=ffn_rank,
    )
    s = SpeculativeStreams(model.config, config)
    # Untrained but not inert: random adapters, so drafts are arbitrary tokens.
    with torch.no_grad():
        for p in s.parameters():
            p.normal_(0, 0.2)
    return s.eval()


@pytest.fixture(scope="module")
def streams(model: Transformer) -> SpeculativeStreams:
    """Token-aware streams (the default kind): they run after verification. They also have
    feed-forward adapters, so every test below covers those too."""
    return _random_streams(model, next_token_rank=4, ffn_rank=3)


@pytest.fixture(scope="module")
def plain_streams(model: Transformer) -> SpeculativeStreams:
    """Streams without the next-token input, which can also run inside the pass."""
    return _random_streams(model, next_token_rank=0)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("shape", [TreeShape(), TreeShape(top_k=(1, 1, 1), max_nodes=4)])
@pytest.mark.parametrize("placement", ["accepted", "all"])
def test_untrained_streams_are_lossless(
    model: Transformer,
    streams: SpeculativeStreams,
    plain_streams: SpeculativeStreams,
    seed: int,
    shape: TreeShape,
    placement: str,
) -> None:
    prompt = _prompt(4 + 3 * seed, seed)
    ar = generate_ar(model, prompt, 48)
    chosen = streams if placement == "accepted" else plain_streams
    ss = generate_ss(model, chosen, prompt, 48, shape=shape, placement=placement)
    assert ss.token_ids == ar.token_ids
    assert ss.forward_passes <= ar.forward_passes


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("placement", ["accepted", "all"])
def test_a_grafted_lookup_branch_stays_lossless_and_saves_passes_on_loops(
    model: Transformer,
    streams: SpeculativeStreams,
    plain_streams: SpeculativeStreams,
    seed: int,
    placement: str,
) -> None:
    # Few distinct tokens: the prompt repeats itself and the tiny model's output loops, so
    # lookups find drafts (and random streams rarely do).
    prompt = _prompt(4 + 3 * seed, seed) + [7, 8, 9, 10] * 4
    chosen = streams if placement == "accepted" else plain_streams
    ar = generate_ar(model, prompt, 60)
    alone = generate_ss(model, chosen, prompt, 60, placement=placement)
    hybrid = generate_ss(model, chosen, prompt, 60, placement=placement, lookup_tokens=6)
    assert hybrid.token_ids == alone.token_ids == ar.token_ids
    assert hybrid.forward_passes < alone.forward_passes
    # Lookup drafts verified alone (no stream tree) where the last 2 tokens recur: still AR.
    first = generate_ss(
        model, chosen, prompt, 60, placement=placement, lookup_tokens=6, lookup_alone_ngram=2
    )
    assert first.token_ids == ar.token_ids
    assert first.forward_passes < alone.forward_passes


def test_lookup_drafts_verified_alone_skip_the_stream_pass(
    model: Transformer, streams: SpeculativeStreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    import edgestream.llm.engine as engine

    prompt = _prompt(6, 0) + [7, 8, 9, 10] * 4
    calls = {"streams": 0}
    real = engine.stream_pass

    def counted(*args: object, **kwargs: object) -> object:
        calls["streams"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "stream_pass", counted)
    grafted = generate_ss(model, streams, prompt, 40, lookup_tokens=6)
    with_grafts = calls["streams"]
    calls["streams"] = 0
    first = generate_ss(model, streams, prompt, 40, lookup_tokens=6, lookup_alone_ngram=1)
    assert first.token_ids == grafted.token_ids == generate_ar(model, prompt, 40).token_ids
    # A stream pass follows every verification when grafting, only lookup misses otherwise.
    assert with_grafts == grafted.forward_passes - 1
    assert calls["streams"] < first.forward_passes - 1
    with pytest.raises(ValueError, match="lookup_alone_ngram"):
        generate_ss(model, streams, prompt, 8, lookup_alone_ngram=1)


def test_grafting_merges_shared_prefixes_and_keeps_parents_first() -> None:
    tree = build_tree(1, torch.tensor([[5, 6], [7, 8]]), torch.zeros(2, 2), TreeShape((2, 2), 5))
    assert tree.tokens == [1, 5, 6, 7, 8] and tree.parents == [-1, 0, 0, 1, 1]
    assert graft_chain(tree, [5, 8, 9]).tokens == [1, 5, 6, 7, 8, 9]  # only 9 is new, under 8
    grafted = graft_chain(tree, [6, 7, 9])
    assert grafted.tokens[5:] == [7, 9] and grafted.parents[5:] == [2, 5]
    assert grafted.depths[5:] == [2, 3]
    assert all(parent < node for node, parent in enumerate(grafted.parents) if node)
    choices = {0: 6, 2: 7, 5: 9, 6: 3}  # the model says 6 7 9 3: the grafted branch holds
    assert accept(grafted, choices.__getitem__) == ([0, 2, 5, 6], 3)
    assert graft_chain(tree, []) == tree


def test_main_logits_are_the_base_models(
    model: Transformer, plain_streams: SpeculativeStreams
) -> None:
    tokens = torch.tensor([_prompt(12, 1)])
    expected = model(tokens, model.new_cache(16))
    out = ss_forward(model, plain_streams, tokens, model.new_cache(16))
    torch.testing.assert_close(out.main_logits, expected, rtol=0, atol=0)
    assert out.stream_hidden.shape == (1, 12, 3, model.config.dim)


def test_streams_after_verification_equal_streams_in_the_pass(
    model: Transformer, plain_streams: SpeculativeStreams
) -> None:
    """stream_pass for the newest token reproduces that token's in-pass streams."""
    tokens = torch.tensor([_prompt(9, 7)])
    in_pass = ss_forward(model, plain_streams, tokens, model.new_cache(16))
    cache = model.new_cache(16)
    none = torch.zeros(0, dtype=torch.long)
    later = ss_forward(model, plain_streams, tokens, cache, stream_nodes=none)
    assert later.stream_hidden.shape[1] == 0
    after = stream_pass(model, plain_streams, later.split_hidden[:, -1], 8, cache, next_token=0)
    torch.testing.assert_close(after, in_pass.stream_hidden[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pack", [False, True])
@torch.inference_mode()
def test_merged_adapters_draft_what_the_adapters_draft(
    streams: SpeculativeStreams, plain_streams: SpeculativeStreams, pack: bool, tmp_path: Path
) -> None:
    """Folding the adapters into copies of the projections changes rounding only, for plain
    and packed models, in and after the pass; the streams given stay trainable and unchanged."""
    if pack and not can_pack_weights():
        pytest.skip("this PyTorch build has no oneDNN")
    base = Transformer.from_hf(tiny_llama(max_position=128))
    base = base.pack_weights() if pack else base
    before = {k: v.clone() for k, v in streams.state_dict().items()}
    merged = streams.merged_for(base)
    assert all(isinstance(a, StreamAdapter) for a in streams.adapters)
    assert all(torch.equal(v, before[k]) for k, v in streams.state_dict().items())
    tokens = torch.tensor([_prompt(9, 7)])
    cache = base.new_cache(16)
    none = torch.zeros(0, dtype=torch.long)
    out = ss_forward(base, streams, tokens, cache, stream_nodes=none)
    args = (out.split_hidden[:, -1], 8, cache, 5)
    expected = stream_pass(base, streams, *args)
    torch.testing.assert_close(stream_pass(base, merged, *args), expected, rtol=1e-4, atol=1e-4)
    in_pass = ss_forward(base, plain_streams, tokens, base.new_cache(16)).stream_hidden
    got = ss_forward(base, plain_streams.merged_for(base), tokens, base.new_cache(16))
    torch.testing.assert_close(got.stream_hidden, in_pass, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="cannot be saved"):
        save_streams(merged, tmp_path / "merged.safetensors", {})
    prompt = _prompt(10, 3)
    ss = generate_ss(base, merged, prompt, 40)
    assert ss.token_ids == generate_ar(base, prompt, 40).token_ids


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.qint8])
@torch.inference_mode()
def test_low_precision_drafting_stays_lossless_and_close_to_float32_drafts(
    streams: SpeculativeStreams, plain_streams: SpeculativeStreams, pack: bool, dtype: torch.dtype
) -> None:
    """Stream rows through bfloat16 or int8 copies of the stream layers (and a draft head in
    the same) draft nearly what float32 drafts, while the decoded text stays the float32
    model's."""
    if pack and not can_pack_weights():
        pytest.skip("this PyTorch build has no oneDNN")
    if dtype == torch.qint8 and not int8_available():
        pytest.skip("this PyTorch build has no int8 engine")
    base = Transformer.from_hf(tiny_llama(max_position=128))
    base = base.pack_weights() if pack else base
    tokens = torch.tensor([_prompt(9, 7)])
    cache = base.new_cache(16)
    out = ss_forward(base, streams, tokens, cache, stream_nodes=torch.zeros(0, dtype=torch.long))
    args = (out.split_hidden[:, -1], 8, cache, 5)
    for trained in (streams, plain_streams):  # with adapters and with embeddings only
        low = trained.merged_for(base, dtype)
        assert all(isinstance(a, MergedStreamLayer) and a.dtype == dtype for a in low.adapters)
        expected = stream_pass(base, trained, *args)
        got = stream_pass(base, low, *args)
        assert got.dtype == torch.float32  # the residual stream stays in the model's dtype
        error = (got - expected).norm() / expected.norm()
        # Rounding, no more (and not none: it ran); int8 rounds its inputs too, with one
        # scale for all rows, in every linear of the pass.
        assert 0 < error < (0.02 if dtype == torch.bfloat16 else 0.1), error
        head = DraftHead(base, low)
        assert head.dtype == (torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
        ids, log_probs = head.top_k(got[0], 2)
        assert ids.shape == log_probs.shape == (trained.config.n_streams, 2)
        for prompt in (_prompt(10, 3), _prompt(12, 5)):
            expected_ids = generate_ar(base, prompt, 40).token_ids
            assert generate_ss(base, low, prompt, 40, head=head).token_ids == expected_ids


def test_streams_depend_only_on_the_past(
    model: Transformer, plain_streams: SpeculativeStreams
) -> None:
    """Stream states at position t must not change when later tokens change."""
    a, b = _prompt(10, 2), _prompt(10, 2)
    b[7:] = [5, 6, 7]
    out_a = ss_forward(model, plain_streams, torch.tensor([a]), model.new_cache(10))
    out_b = ss_forward(model, plain_streams, torch.tensor([b]), model.new_cache(10))
    torch.testing.assert_close(out_a.stream_hidden[:, :7], out_b.stream_hidden[:, :7])
    assert not torch.allclose(out_a.stream_hidden[:, 7:], out_b.stream_hidden[:, 7:])


def test_stop_token_inside_an_accepted_run_stops_there(
    model: Transformer, streams: SpeculativeStreams
) -> None:
    prompt = _prompt(6, 3)
    free = generate_ar(model, prompt, 40).token_ids
    stop = free[9]
    ss = generate_ss(model, streams, prompt, 40, stop_ids={stop})
    assert ss.token_ids == free[: free.index(stop) + 1]
    assert ss.finish_reason == "stop"


@pytest.mark.parametrize("max_new", [1, 2, 5, 17])
def test_max_new_tokens_is_exact(
    model: Transformer, streams: SpeculativeStreams, max_new: int
) -> None:
    prompt = _prompt(5, 4)
    ss = generate_ss(model, streams, prompt, max_new)
    assert ss.token_ids == generate_ar(model, prompt, max_new).token_ids
    assert ss.new_tokens == max_new and ss.finish_reason == "length"


def test_decoding_up_to_the_context_end(model: Transformer, streams: SpeculativeStreams) -> None:
    prompt = _prompt(120, 5)  # context 128: streams' positions run past the end
    ss = generate_ss(model, streams, prompt, 50)
    assert ss.token_ids == generate_ar(model, prompt, 50).token_ids
    assert ss.finish_reason == "context" and ss.new_tokens == 8


def test_tree_follows_probabilities_under_the_budget() -> None:
    candidates = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    log_probs = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.9, 0.05, 0.05], [0.5, 0.3, 0.2]]))
    tree = build_tree(1, candidates, log_probs, TreeShape(top_k=(3, 2, 2), max_nodes=6))
    # Best paths: 10 (.7), 10-20 (.63), 10-20-30 (.315), 11 (.2), 10-20-31 (.19)
    assert tree.tokens == [1, 10, 11, 20, 30, 31]
    assert tree.parents == [-1, 0, 0, 1, 3, 3]
    assert tree.depths == [0, 1, 1, 2, 3, 3]
    # A probability floor drops the paths under it, however much budget is left.
    pruned = TreeShape(top_k=(3, 2, 2), max_nodes=6, min_path_prob=0.25)
    assert build_tree(1, candidates, log_probs, pruned).tokens == [1, 10, 20, 30]
    with pytest.raises(ValueError, match="min_path_prob"):
        TreeShape(min_path_prob=1.0)


def test_tree_never_exceeds_the_depth_given() -> None:
    tree = build_tree(1, torch.tensor([[5, 6]]), torch.zeros(1, 2), TreeShape(top_k=(2, 2)))
    assert max(tree.depths) == 1 and len(tree) == 3
    root_only = build_tree(1, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2), TreeShape())
    assert root_only.tokens == [1]


def test_acceptance_walks_the_matching_branch() -> None:
    tree = DraftTree([1, 5, 6, 7, 8], [-1, 0, 0, 2, 2], [0, 1, 1, 2, 2])
    assert accept(tree, [6, 0, 8, 0, 3].__getitem__) == ([0, 2, 4], 3)
    assert accept(tree, [9, 0, 0, 0, 0].__getitem__) == ([0], 9)


def test_tree_mask_rows_are_ancestor_sets() -> None:
    tree = DraftTree([1, 5, 6, 7], [-1, 0, 1, 0], [0, 1, 2, 1])
    mask = tree_mask(tree, prefix=2)
    assert mask[:, :2].all()
    assert mask[2, 2:].tolist() == [True, True, True, False]
    assert mask[3, 2:].tolist() == [True, False, False, True]


def test_stream_mask_blocks_other_nodes_and_later_streams() -> None:
    node_mask = torch.tensor([[[[True, False, False], [True, True, True]]]])
    mask = stream_mask(node_mask, 2)[0, 0]
    assert mask.shape == (4, 3 + 4)
    assert mask[1, 3:].tolist() == [True, True, False, False]  # node 0, stream 2
    assert mask[2, :3].tolist() == [True, True, True]  # node 1 sees its own prefix
    assert mask[2, 3:].tolist() == [False, False, True, False]


def test_stream_weights_round_trip(
    model: Transformer, streams: SpeculativeStreams, tmp_path: Path
) -> None:
    path = tmp_path / "streams.safetensors"
    save_streams(streams, path, {"steps": 3})
    loaded, info = load_streams(path, model)
    assert info == {"steps": 3}
    for (name, a), (_, b) in zip(
        streams.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a stream weights file"):
        load_streams(bad, model)
    with pytest.raises(FileNotFoundError):
        load_streams(tmp_path / "missing.safetensors", model)


@torch.inference_mode()
def test_feed_forward_adapters_start_from_the_given_drafts(
    model: Transformer, plain_streams: SpeculativeStreams
) -> None:
    """Adding feed-forward adapters to trained streams changes nothing until they train; once
    their weights move, the drafts move, and the config records the rank."""
    grown = copy.deepcopy(plain_streams)
    grown.add_feed_forward_adapters(model.config, 5)
    assert grown.config.ffn_rank == 5 and plain_streams.config.ffn_rank == 0
    tokens = torch.tensor([_prompt(9, 7)])
    before = ss_forward(model, plain_streams, tokens, model.new_cache(16)).stream_hidden
    after = ss_forward(model, grown, tokens, model.new_cache(16)).stream_hidden
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    with torch.no_grad():
        grown.adapters[-1].down.up.weight.normal_(0, 0.2)
    moved = ss_forward(model, grown, tokens, model.new_cache(16)).stream_hidden
    assert not torch.allclose(moved, before, atol=1e-3)
    merged = ss_forward(model, grown.merged_for(model), tokens, model.new_cache(16)).stream_hidden
    torch.testing.assert_close(merged, moved, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="already have feed-forward adapters"):
        grown.add_feed_forward_adapters(model.config, 5)
    bare_config = StreamConfig(n_stream_layers=1, adapter_rank=0, draft_vocab_size=0)
    bare = SpeculativeStreams(model.config, bare_config)
    with pytest.raises(ValueError, match="need streams with adapters"):
        bare.add_feed_forward_adapters(model.config, 2)


def test_token_aware_streams_refuse_to_run_inside_the_pass(
    model: Transformer, streams: SpeculativeStreams
) -> None:
    with pytest.raises(ValueError, match="token-aware streams"):
        ss_forward(model, streams, torch.tensor([_prompt(5, 1)]), model.new_cache(8))


def test_stream_config_is_validated(model: Transformer) -> None:
    with pytest.raises(ValueError, match="n_streams must be >= 1"):
        StreamConfig(n_streams=0)
    with pytest.raises(ValueError, match="ffn_rank needs adapter_rank"):
        StreamConfig(adapter_rank=0, ffn_rank=4)
    with pytest.raises(ValueError, match="exceeds the model's 3 layers"):
        SpeculativeStreams(model.config, StreamConfig(n_stream_layers=4))
