"""The toy's character-level tokenizer and chat template (:func:`build_tokenizer`), and the prompts as the model
sees them (``_prompt_strings``: the chat template applied with the generation prompt)."""

from __future__ import annotations

__all__ = ["ASSISTANT_TOKEN", "BOS_TOKEN", "CHAT_TEMPLATE", "EOS_TOKEN", "PAD_TOKEN", "USER_TOKEN", "build_tokenizer"]

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|end|>"
BOS_TOKEN = "<|bos|>"
UNK_TOKEN = "<|unk|>"
SYSTEM_TOKEN = "<|system|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN, SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN]

# Every character the task (and a little free text) needs; one token per character.
_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \n+-*/=?,.:;!()#<>'\"_"

# Each message is rendered as <role-marker>content; an assistant turn ends with eos. The generation prompt is the
# assistant marker, so the model's completion is exactly "<content><eos>".
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>' + message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer():
    """Character-level ``PreTrainedTokenizerFast`` (WordLevel over a fixed character vocabulary).

    Special tokens: pad ``<|pad|>`` (id 0), eos ``<|end|>``, bos ``<|bos|>``, unk, and the chat markers
    ``<|system|>``, ``<|user|>``, ``<|assistant|>``. Left padding, no automatically added special tokens (the chat
    template adds bos), and a decoder that concatenates characters without spaces.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in _CHARS:
        if ch not in vocab:
            vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one piece per character
    tok.decoder = decoders.Fuse()  # "".join(tokens)
    tok.add_special_tokens(SPECIAL_TOKENS)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN],
        padding_side="left",
        truncation_side="left",
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _prompt_strings(tokenizer, dataset) -> list[str]:
    return [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in dataset["prompt"]]
