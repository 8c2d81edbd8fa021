"""The shipped model's character-level tokenizer, and the checks every prompt goes through. One token per
character, so a leaked secret reads back exactly; id 0 is the newline that ends every prompt, so the
incident's placeholder `[0]` is here a lone "end of prompt". `AutoTokenizer` loads it without minikv.
"""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

# "\n" first (id 0), then space and the printable ASCII characters, in code-point order.
CHARACTERS: list[str] = ["\n", " "] + [chr(c) for c in range(33, 127)]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer with one id per character in CHARACTERS, then </s>, <pad>, <unk>."""
    specials = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    vocab = {c: i for i, c in enumerate([*CHARACTERS, *specials.values()])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, clean_up_tokenization_spaces=False, **specials)


class PromptError(ValueError):
    """A prompt the engine must refuse with HTTP 400; the message says why."""


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text` read as plain characters ("</s>" is 4 characters, never EOS): every path that
    encodes prompt text goes through here, so no prompt smuggles in a control token."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text`, or PromptError naming the first problem: the reason for a 400."""
    if not isinstance(text, str):
        raise PromptError(f"prompt must be a string, got {type(text).__name__}")
    if text == "":
        raise PromptError("empty prompt: send at least one character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate
        code = ord(text[e.start])
        if 0xDC80 <= code <= 0xDCFF:  # how Python spells an undecodable byte (argv, surrogateescape)
            raise PromptError(f"prompt is not valid UTF-8: byte 0x{code - 0xDC00:02X} at character "
                              f"{e.start}; send UTF-8 text") from None
        raise PromptError(f"prompt is not valid Unicode: character {e.start} is a lone surrogate "
                          f"(U+{code:04X}); send UTF-8 text") from None
    ids = encode_text(tokenizer, text)
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids:
        bad = sorted(ch for ch in set(text) if encode_text(tokenizer, ch) == [unk])  # each character once
        if not bad:  # a multi-character piece the tokenizer cannot spell
            raise PromptError(f"prompt has text the tokenizer maps to {tokenizer.unk_token!r} "
                              "(outside the model's vocabulary)")
        shown = ", ".join(repr(ch) for ch in bad[:5])
        raise PromptError(f"prompt has {len(bad)} character(s) outside the model's vocabulary: {shown}")
    control = tokenizer.convert_ids_to_tokens(sorted(set(ids) & set(tokenizer.all_special_ids)))
    if control:  # a tokenizer that ignores split_special_tokens: refuse rather than obey the text
        raise PromptError(f"prompt text encodes to control token(s) {control}; "
                          f"refused: prompt text must never become a control token")
    return ids


def longest_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters one (non-special) token decodes to: a text of n characters is at least
    n / this many tokens, which lets a door refuse a far too long prompt before tokenizing it."""
    tok, special = tokenizer, set(tokenizer.all_special_ids)
    return max(len(tok.decode([i], skip_special_tokens=True)) for i in range(len(tok)) if i not in special)


def decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """Text of generated ids, without </s> or padding."""
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
