"""How likely the language model finds a text: the log-probability of its tokens.

Used to rescore a speech recognizer's candidate transcripts (`edgestream.assist.rescore`): the
model reads each text as a document of its own (after the tokenizer's end-of-text token, as it
saw documents in pre-training) and the text scores the sum of its tokens' log-probabilities,
plus, with `score_end`, that of the end-of-text token after it, so that a candidate which
stops mid-phrase pays for it.
"""

from __future__ import annotations

import torch

from edgestream.llm.loading import LanguageModel


def document_start_id(lm: LanguageModel) -> int:
    """The token that separates documents: the tokenizer's end-of-text token."""
    tokenizer = lm.tokenizer
    for name in ("<|endoftext|>", "</s>"):
        token_id = tokenizer.convert_tokens_to_ids(name)
        # An unknown name maps to the unknown token's id: check that the id is this token.
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == name:
            return token_id
    raise ValueError(f"model {lm.name!r} has no end-of-text token to start a document with")


@torch.inference_mode()
def text_log_probs(lm: LanguageModel, texts: list[str], score_end: bool = True) -> list[float]:
    """Natural-log probability of each text as a whole document, in one batched pass.

    Texts are right-padded to a common length; under the causal mask padding after a text
    cannot change its tokens' scores, and the padded positions are not summed.
    """
    if not texts:
        return []
    start = document_start_id(lm)
    sequences = []
    for text in texts:
        ids = [start, *lm.tokenizer.encode(text, add_special_tokens=False)]
        sequences.append([*ids, start] if score_end else ids)
    longest = max(len(ids) for ids in sequences)
    if longest > lm.context_length:
        raise ValueError(f"a text of {longest} tokens exceeds the model's {lm.context_length}")
    tokens = torch.tensor([ids + [start] * (longest - len(ids)) for ids in sequences])
    cache = lm.model.new_cache(longest, batch_size=len(texts))
    log_probs = torch.log_softmax(lm.model(tokens, cache), dim=-1)
    next_token = log_probs[:, :-1].gather(2, tokens[:, 1:, None])[..., 0]
    lengths = torch.tensor([len(ids) - 1 for ids in sequences])
    scored = torch.arange(longest - 1)[None, :] < lengths[:, None]
    return (next_token * scored).sum(dim=1).tolist()
