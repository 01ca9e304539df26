"""How likely the language model finds a text: the log-probability of its tokens.

Used to rescore a speech recognizer's candidate transcripts (`edgestream.assist.rescore`): the
model reads each text as a document of its own (after the tokenizer's end-of-text token, as it
saw documents in pre-training) and the text scores the sum of its tokens' log-probabilities,
plus, with `score_end`, that of the end-of-text token after it, so that a candidate which
stops mid-phrase pays for it.

Candidates from one beam search share most of their tokens, so they are merged into a prefix
tree and scored in one pass with a tree attention mask (the mask that verifies Speculative
Streaming's drafts): each shared prefix is computed once. Eight candidates of a 4-second
utterance hold ~150 tokens but ~40 tree nodes.
"""

from __future__ import annotations

import itertools

import torch

from edgestream.llm.loading import LanguageModel
from edgestream.llm.tree import DraftTree, tree_mask


def document_start_id(lm: LanguageModel) -> int:
    """The token that separates documents: the tokenizer's end-of-text token."""
    tokenizer = lm.tokenizer
    for name in ("<|endoftext|>", "</s>"):
        token_id = tokenizer.convert_tokens_to_ids(name)
        # An unknown name maps to the unknown token's id: check that the id is this token.
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == name:
            return token_id
    raise ValueError(f"model {lm.name!r} has no end-of-text token to start a document with")


def prefix_tree(sequences: list[list[int]]) -> tuple[DraftTree, list[list[int]]]:
    """Merge token sequences that start with the same token into one tree, shared prefixes
    once; returns the tree and each sequence's nodes, root first.

    >>> tree, paths = prefix_tree([[0, 5, 6], [0, 5, 7], [0, 8]])
    >>> tree.tokens, tree.parents, paths
    ([0, 5, 6, 7, 8], [-1, 0, 1, 1, 0], [[0, 1, 2], [0, 1, 3], [0, 4]])
    """
    if len({sequence[0] for sequence in sequences}) != 1:
        raise ValueError("every sequence must start with the same token")
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    node_of: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    paths = []
    for sequence in sequences:
        parent, path = -1, []
        for depth, token in enumerate(sequence):
            if (parent, token) not in node_of:
                node_of[parent, token] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                depths.append(depth)
            parent = node_of[parent, token]
            path.append(parent)
        paths.append(path)
    return DraftTree(tokens, parents, depths), paths


@torch.inference_mode()
def text_log_probs(lm: LanguageModel, texts: list[str], score_end: bool = True) -> list[float]:
    """Natural-log probability of each text as a whole document, in one tree-masked pass."""
    if not texts:
        return []
    start = document_start_id(lm)
    sequences = []
    for text in texts:
        ids = [start, *lm.tokenizer.encode(text, add_special_tokens=False)]
        sequences.append([*ids, start] if score_end else ids)
    tree, paths = prefix_tree(sequences)
    if max(tree.depths) + 1 > lm.context_length:
        raise ValueError(
            f"a text of {max(tree.depths) + 1} tokens exceeds the model's {lm.context_length}"
        )
    tokens = torch.tensor([tree.tokens])
    cache = lm.model.new_cache(len(tree))
    logits = lm.model(tokens, cache, torch.tensor(tree.depths), tree_mask(tree, prefix=0))
    log_probs = torch.log_softmax(logits[0], dim=-1)
    # Each token is scored by the distribution at its parent node: what came right before it.
    return [
        sum(
            float(log_probs[parent, tree.tokens[node]]) for parent, node in itertools.pairwise(path)
        )
        for path in paths
    ]
