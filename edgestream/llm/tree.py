"""Draft trees: building them from stream candidates, their attention mask, acceptance.

A draft tree is flattened in breadth-first order; node 0 is the root, the token the main stream
has already chosen (certain). Every node at depth n >= 1 holds one of the top candidates of
speculative stream n, and the children of every depth-n node are stream n+1's candidates. Which
of those candidate paths to verify is chosen by their estimated probability (the product of the
streams' probabilities along the path) under a node budget, so the tree adapts to how sure the
streams are. All metadata are small host-side lists plus tensors built once per step.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TreeShape:
    """How big a draft tree may grow."""

    # Defaults measured on SmolLM2 with trained streams (docs/benchmarks.md, "Choosing the
    # draft tree"): 8 nodes beat 12 and 16 on a 2-core CPU (12 and 16 accept 6-9% more
    # tokens per pass but decode 3-12% slower overall) and beat chains and 4-6 node trees.
    # Wider candidate lists cost nothing (a top-k over the draft head) and let the best-first
    # search pick 1% more accepted tokens per pass than (4, 3, 2, 1) did.
    top_k: tuple[int, ...] = (8, 6, 4, 2)  # candidates considered per depth (stream 1, 2, ...)
    max_nodes: int = 8  # nodes in the flattened tree, root included
    # Paths the streams give less than this probability are not verified: every node costs
    # verification work, and an unlikely one rarely pays it back.
    min_path_prob: float = 0.0

    def __post_init__(self) -> None:
        if not self.top_k or min(self.top_k) < 1:
            raise ValueError(f"top_k needs at least one depth, each >= 1; got {self.top_k}")
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be >= 1, got {self.max_nodes}")
        if not 0.0 <= self.min_path_prob < 1.0:
            raise ValueError(f"min_path_prob must be in [0, 1), got {self.min_path_prob}")


def parse_counts(text: str, option: str) -> tuple[int, ...]:
    """'8,6,4,2' -> (8, 6, 4, 2), every count >= 1; errors name the `option` it came from.

    >>> parse_counts("8,6,4,2", "--tree-top-k")
    (8, 6, 4, 2)
    """
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{option} expects integers like 8,6,4,2, got {text!r}") from None
    if min(counts) < 1:
        raise ValueError(f"{option} expects every count >= 1, got {text!r}")
    return counts


@dataclass(frozen=True)
class DraftTree:
    tokens: list[int]  # (T,) token per node, node 0 = root
    parents: list[int]  # (T,) parent index per node, -1 for the root
    depths: list[int]  # (T,) 0 for the root

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        """A tree without branches: each token follows the one before it (e.g. a lookup draft)."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), list(range(len(tokens))))

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.tokens]
        for node, parent in enumerate(self.parents):
            if parent >= 0:
                kids[parent].append(node)
        return kids


def build_tree(root: int, candidates: Tensor, log_probs: Tensor, shape: TreeShape) -> DraftTree:
    """The most probable draft paths under `shape`, as a breadth-first flattened tree.

    candidates, log_probs: (depth, k) stream top-k tokens and their log-probabilities, depth
    >= len(shape.top_k) is not required: only min(depth, len(top_k)) depths are used.

    >>> c = torch.tensor([[5, 6], [7, 8]]); lp = torch.log(torch.tensor([[.6, .3], [.9, .1]]))
    >>> t = build_tree(1, c, lp, TreeShape(top_k=(2, 2), max_nodes=4))
    >>> t.tokens, t.parents, t.depths
    ([1, 5, 6, 7], [-1, 0, 0, 1], [0, 1, 1, 2])
    """
    depth_limit = min(candidates.shape[0], len(shape.top_k))
    cand = candidates.tolist()  # host sync: the tree is built on the host
    lps = log_probs.tolist()
    # Best-first search over paths; a path's score is the sum of its log-probabilities, which
    # only falls as the path grows, so every chosen path's prefix is chosen before it.
    chosen: list[tuple[int, ...]] = []
    frontier: list[tuple[float, tuple[int, ...]]] = []
    if depth_limit:
        for i in range(shape.top_k[0]):
            heapq.heappush(frontier, (-lps[0][i], (i,)))
    min_score = math.log(shape.min_path_prob) if shape.min_path_prob > 0 else -math.inf
    while frontier and len(chosen) < shape.max_nodes - 1:
        neg_score, path = heapq.heappop(frontier)
        if -neg_score < min_score:
            break  # best first: every path left is less probable still
        chosen.append(path)
        depth = len(path)
        if depth < depth_limit:
            for i in range(shape.top_k[depth]):
                heapq.heappush(frontier, (neg_score - lps[depth][i], (*path, i)))
    chosen.sort(key=lambda p: (len(p), p))  # breadth-first order: parents precede children
    index = {(): 0}
    tokens, parents, depths = [root], [-1], [0]
    for path in chosen:
        index[path] = len(tokens)
        tokens.append(cand[len(path) - 1][path[-1]])
        parents.append(index[path[:-1]])
        depths.append(len(path))
    return DraftTree(tokens, parents, depths)


def graft_chain(tree: DraftTree, chain: list[int]) -> DraftTree:
    """The tree with `chain` (tokens drafted after the root, e.g. by prompt lookup) merged in
    as a path from the root: it follows existing nodes while they hold the chain's tokens and
    appends the rest, each new node after its parent, so parents still precede children.

    >>> t = DraftTree([1, 5, 6, 7], [-1, 0, 0, 1], [0, 1, 1, 2])
    >>> g = graft_chain(t, [5, 8, 9])
    >>> g.tokens, g.parents, g.depths
    ([1, 5, 6, 7, 8, 9], [-1, 0, 0, 1, 1, 4], [0, 1, 1, 2, 2, 3])
    """
    tokens, parents, depths = list(tree.tokens), list(tree.parents), list(tree.depths)
    kids = tree.children()
    node = 0
    for token in chain:
        match = next((c for c in kids[node] if tokens[c] == token), None)
        if match is None:
            tokens.append(token)
            parents.append(node)
            depths.append(depths[node] + 1)
            kids.append([])
            kids[node].append(len(tokens) - 1)
            match = len(tokens) - 1
        node = match
    return DraftTree(tokens, parents, depths)


def tree_mask(tree: DraftTree, prefix: int) -> Tensor:
    """Boolean (T, prefix + T): every node sees the whole prefix, its ancestors and itself.

    >>> tree_mask(DraftTree([1, 5, 6, 7], [-1, 0, 0, 1], [0, 1, 1, 2]), prefix=1).int()
    tensor([[1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 1, 1, 0, 1]], dtype=torch.int32)
    """
    T = len(tree)
    mask = torch.zeros(T, prefix + T, dtype=torch.bool)
    mask[:, :prefix] = True
    for node in range(T):
        ancestor = node
        while ancestor != -1:
            mask[node, prefix + ancestor] = True
            ancestor = tree.parents[ancestor]
    return mask


def accept(tree: DraftTree, choose: Callable[[int], int]) -> tuple[list[int], int]:
    """Walk the tree as the base model decodes: `choose(node)` is its next token after node
    (greedy, or sampled from its distribution there); descend while a child holds that token.

    Returns the accepted path (node indices, root first) and the token chosen after its last
    node. Every emitted token is the base model's own choice given the tokens before it, so
    greedy output is the autoregressive output, and sampled output has its distribution
    (with deterministic drafts, sampling from the target and keeping the matching child is
    exactly speculative sampling's acceptance rule).

    >>> accept(DraftTree([1, 5, 6, 7], [-1, 0, 0, 1], [0, 1, 1, 2]), [6, 0, 9, 0].__getitem__)
    ([0, 2], 9)
    """
    kids = tree.children()
    path = [0]
    while True:
        token = choose(path[-1])
        match = next((c for c in kids[path[-1]] if tree.tokens[c] == token), None)
        if match is None:
            return path, token
        path.append(match)
