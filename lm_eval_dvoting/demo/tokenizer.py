"""The demo model's character-level tokenizer, saved in transformers' format.

Every printable ASCII character is one token. Two frequent strings are single added
tokens so that sequences stay short (sequence length is what a CPU pays for): the
whole instruction sentence of the paper's prompt (`arith.INSTRUCTION`) and
``\\boxed{``. Special tokens: ``<|endoftext|>`` (end of text, also padding),
``<|mdm_mask|>`` (the diffusion mask) and ``<|unk|>``.

The chat template renders the messages' contents as they are, so a prompt reads the
same with and without ``--apply_chat_template``.

It is an ordinary `PreTrainedTokenizerFast` (a BPE model without merges, i.e. one
token per character), so ``AutoTokenizer.from_pretrained(folder)`` loads it without
remote code.
"""

from __future__ import annotations

import string

from lm_eval_dvoting.demo.arith import INSTRUCTION

EOS, MASK, UNK = "<|endoftext|>", "<|mdm_mask|>", "<|unk|>"
BOXED = "\\boxed{"
SPECIAL_TOKENS = [EOS, MASK, UNK]
WORD_TOKENS = [INSTRUCTION, BOXED]
CHARACTERS = [" ", "\n"] + [c for c in string.printable if c not in string.whitespace]
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def vocabulary() -> dict[str, int]:
    tokens = SPECIAL_TOKENS + WORD_TOKENS + CHARACTERS
    return {token: i for i, token in enumerate(tokens)}


def build_tokenizer():
    """A fresh `PreTrainedTokenizerFast` (ids fixed by `vocabulary()`)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, normalized=False, special=False) for t in WORD_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
