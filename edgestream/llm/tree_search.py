"""Choosing a draft tree by simulation, without decoding.

Distilled answers are the base model's own greedy tokens, so what a draft tree would accept
anywhere in them is known in advance. One batched pass gives the streams' top-k at every answer
position of held-out sequences (`held_out_drafts`); `simulate` then walks each answer as the
decoder would, building every pass's tree from those candidates and following the answer
through it, and counts the passes. That is the decoder's acceptance for any `TreeShape` in
seconds instead of a benchmark per shape. Acceptance is half of speed: a bigger tree costs more
to verify, so shapes the simulation ranks close are then timed against each other
(`python -m edgestream.bench.compare_streams --trees ...`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from edgestream.llm.train import StreamObjective, TrainConfig, every_answer_position
from edgestream.llm.tree import TreeShape, accept, build_tree


@dataclass(frozen=True)
class AnswerDrafts:
    """One distilled sequence and its streams' candidates at every answer position."""

    tokens: list[int]  # prompt + greedy answer
    prompt_length: int
    # (n, gamma, k) for positions t = prompt_length - 1, ..., len(tokens) - 3: stream j's top-k
    # guesses for token t + 2 + j, the main stream having chosen token t + 1 (the tree's root)
    candidates: Tensor
    log_probs: Tensor


@dataclass(frozen=True)
class Walk:
    tokens: int  # tokens emitted by verification passes (the prefill's first token not counted)
    passes: int  # verification passes

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / max(1, self.passes)


@torch.no_grad()
def held_out_drafts(
    objective: StreamObjective,
    records: list[dict],
    k: int,
    batch_sequences: int = 4,
    context_drafts: bool = True,
) -> list[AnswerDrafts]:
    """The streams' top-k candidates at every answer position of distilled `records`; with
    `context_drafts`, as the decoder drafts by default, among the draft vocabulary and the
    tokens outside it that the context (prompt, answer up to the root) already holds."""
    gamma = objective.streams.config.n_streams
    vocab_ids = objective.vocabulary_ids(torch.arange(len(objective.head_weight)))
    in_vocab = frozenset(vocab_ids.tolist())
    drafts = []
    for start in range(0, len(records), batch_sequences):
        chunk = records[start : start + batch_sequences]
        states = objective.draft_states(every_answer_position(chunk, TrainConfig(), gamma))
        for b, record in enumerate(chunk):
            # make_batch lists every answer position in order, then pads
            n = len(record["tokens"]) - record["prompt_length"] - 1
            logits = F.linear(states[b, :n], objective.head_weight).float()
            ids = vocab_ids
            if context_drafts and objective.streams.config.draft_vocab_size:
                logits, ids = _with_context(
                    objective, states[b, :n], logits, record, vocab_ids, in_vocab
                )
            log_probs, columns = torch.log_softmax(logits, -1).topk(k, -1)
            drafts.append(
                AnswerDrafts(
                    record["tokens"].tolist(), record["prompt_length"], ids[columns], log_probs
                )
            )
    return drafts


def _with_context(
    objective: StreamObjective,
    states: Tensor,
    logits: Tensor,
    record: dict,
    vocab_ids: Tensor,
    in_vocab: frozenset[int],
) -> tuple[Tensor, Tensor]:
    """Logits (n, gamma, V_d) extended by the record's tokens outside the draft vocabulary,
    each masked out at the answer positions that precede its first occurrence, and the ids of
    every column: what `msa.ContextTokens` gives the decoder at each position."""
    first: dict[int, int] = {}
    for position, token in enumerate(record["tokens"].tolist()):
        if token not in in_vocab:
            first.setdefault(token, position)
    if not first:
        return logits, vocab_ids
    extra = torch.tensor(list(first))
    rows = objective.model.lm_head_weight()[extra].to(states.dtype)
    extra_logits = F.linear(states, rows).float()  # (n, gamma, E)
    # Answer position i is t = P - 1 + i, whose context ends with the root, token P + i.
    known_from = torch.tensor(list(first.values())) - record["prompt_length"]
    unknown = torch.arange(len(states))[:, None] < known_from[None, :]  # (n, E)
    extra_logits = extra_logits.masked_fill(unknown[:, None, :], float("-inf"))
    return torch.cat([logits, extra_logits], -1), torch.cat([vocab_ids, extra])


def simulate(drafts: list[AnswerDrafts], shape: TreeShape) -> Walk:
    """Decode every answer as `generate_ss` would with `shape` (greedy, budget = the answer)."""
    held = min((answer.candidates.shape[-1] for answer in drafts), default=0)
    if drafts and held < max(shape.top_k):
        raise ValueError(f"the drafts hold top-{held} candidates; {shape} needs {max(shape.top_k)}")
    tokens = passes = 0
    for answer in drafts:
        seq, t = answer.tokens, answer.prompt_length - 1
        while t <= len(seq) - 3:  # the main stream at t has chosen token t + 1: the root
            i = t - (answer.prompt_length - 1)
            depth = min(len(shape.top_k), len(seq) - t - 3)  # no deeper than the budget left
            tree = build_tree(seq[t + 1], answer.candidates[i, :depth], answer.log_probs[i], shape)
            # the model's greedy choice after each node: the answer's token after its depth
            choices = [seq[t + 2 + d] for d in tree.depths]
            path, _ = accept(tree, choices.__getitem__)
            accepted = len(path) - 1
            tokens += accepted + 1  # the accepted path and the main stream's next choice
            passes += 1
            t += accepted + 1
    return Walk(tokens, passes)
