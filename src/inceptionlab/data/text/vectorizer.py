"""Text to fixed-length id sequences, as the guide's Keras `TextVectorization` layer does it.

The guide (TensorFlow's text-classification tutorial) standardizes with

    lowercase -> replace "<br />" with " " -> delete every character of string.punctuation

splits on whitespace, keeps the most frequent words, and pads or truncates each review at the
end to `sequence_length = 250` ids. `TextVectorizer` does the same with a HuggingFace
`tokenizers.Tokenizer` (Rust, parallel), and saves it as one `tokenizer.json` that plain
`tokenizers.Tokenizer.from_file` loads and encodes with identical ids, so an exported model needs
none of this package's code.

Vocabulary (a decision, see `fit`): id 0 = "[PAD]", id 1 = "[UNK]" (out of vocabulary), then the
`max_tokens - 1` most frequent words, most frequent first, ties broken by the word's byte order
(`WordLevelTrainer` sorts by count, then word), so the same texts always give the same ids.
With the guide's max_features = 10,000 that is 10,001 ids, exactly the rows of its
`Embedding(max_features + 1, 16)`.

Fast paths, tested to give the tokenizer's own results (the saved tokenizer.json is the reference):
ASCII texts are standardized in Python (`standardize_ascii`), the others by the normalizer, whose
Unicode rules matter there; words are split and looked up in Python wherever `str.split` splits as
`WhitespaceSplit` does (`splits_like_rust`), which on IMDB is twice as fast as `encode_batch_fast`
on two cores (0.7 against 2.7 s for 25,000 reviews, AMD EPYC).

Known differences from the TensorFlow code, all on non-ASCII text only:
- `tf.strings.lower` lowercases ASCII only; `Lowercase()` lowercases every script ("É" -> "é";
  50 of the 50,000 IMDB reviews hold such a capital). It maps character by character, so a
  final Greek capital sigma becomes "σ" where Python's str.lower gives "ς".
- `tf.strings.split` splits on ASCII whitespace; `WhitespaceSplit()` on Unicode whitespace too.
  In IMDB that is U+0085 (a cp1252 "…" decoded as Latin-1, 1,479 times) and U+00A0: 692 of the
  50,000 reviews, where "well" U+0085 "i" gives the words "well", "i" instead of one rare token.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel

from inceptionlab.data.text.standardize import StandardizedTexts, guide_normalizer, standardize_all
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text

PAD_TOKEN, PAD_ID = "[PAD]", 0
OOV_TOKEN, OOV_ID = "[UNK]", 1
DEFAULT_MAX_TOKENS = 10_000  # the guide's max_features
DEFAULT_SEQ_LEN = 250  # the guide's sequence_length
TOKENIZER_FILE = "tokenizer.json"

# str.split() (str.isspace) and WhitespaceSplit() (Rust's char::is_whitespace) split on the same
# characters except U+001C..U+001F, which only str.split() treats as whitespace: checked over every
# code point for the pinned Python and tokenizers (tests/test_text_imdb.py).
_ONLY_PYTHON_WHITESPACE = re.compile("[\x1c-\x1f]")


def guide_tokenizer(vocab: dict[str, int]) -> Tokenizer:
    """Normalizer + whitespace split + word-level model over `vocab`."""
    tokenizer = Tokenizer(WordLevel(vocab, unk_token=OOV_TOKEN))
    tokenizer.normalizer = guide_normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def splits_like_rust(text: str) -> bool:
    """True when `text.split()` gives exactly the words of `pre_tokenizers.WhitespaceSplit()`."""
    return _ONLY_PYTHON_WHITESPACE.search(text) is None


def count_words(standardized: StandardizedTexts) -> Counter:
    """Occurrences of each whitespace-separated word, as `WordLevelTrainer` counts them.

    `pre_tokenize_str` costs ~0.5 ms per review, so it only splits the rare texts str.split cannot.
    """
    counts: Counter = Counter()
    splitter = pre_tokenizers.WhitespaceSplit()
    for text in standardized:
        counts.update(text.split() if splits_like_rust(text) else [w for w, _ in splitter.pre_tokenize_str(text)])
    return counts


def ranked_vocabulary(counts: Counter, max_tokens: int) -> dict[str, int]:
    """"[PAD]" 0, "[UNK]" 1, then the `max_tokens - 1` most frequent words, ties by word.

    The order of `WordLevelTrainer` (count descending, then the word's bytes, which for valid
    UTF-8 is code point order, as Python compares str), counted in Python: 0.9-1.4 s against
    1.7-1.9 s for `train_from_iterator` on IMDB's 20,000 training reviews (AMD EPYC).
    """
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: max_tokens - 1]
    return {PAD_TOKEN: PAD_ID, OOV_TOKEN: OOV_ID, **{word: i for i, (word, _) in enumerate(ranked, start=2)}}


def without_normalizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of `tokenizer` for texts that are standardized already (same ids, padding, truncation)."""
    bare = Tokenizer.from_str(tokenizer.to_str())
    bare.normalizer = None
    return bare


def set_fixed_length(tokenizer: Tokenizer, seq_len: int) -> None:
    # Right-side padding and truncation: Keras keeps the first `sequence_length` tokens and pads
    # after them. Both settings are saved inside tokenizer.json.
    tokenizer.enable_truncation(max_length=seq_len, direction="right")
    tokenizer.enable_padding(direction="right", pad_id=PAD_ID, pad_token=PAD_TOKEN, length=seq_len)


def check_positive(name: str, value: int, minimum: int) -> int:
    if not isinstance(value, int) or value < minimum:
        raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}; fix the setting")
    return value


class TextVectorizer:
    """Standardize, split and map texts to (N, seq_len) int64 ids; see the module docstring."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._bare = without_normalizer(tokenizer)  # encodes StandardizedTexts
        self._lookup = python_lookup(tokenizer)

    # --- building ---------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        texts: Iterable[str],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        seq_len: int = DEFAULT_SEQ_LEN,
    ) -> TextVectorizer:
        """Learn the vocabulary of `texts`: "[PAD]", "[UNK]" and the `max_tokens - 1` most frequent words.

        `max_tokens` is the guide's max_features, and vocab_size = max_tokens + 1 matches the
        guide's Embedding(max_features + 1). Keras itself would keep only max_tokens - 2 words and
        leave the embedding's last row unused; here that row holds one more word. Fewer distinct
        words than that give a smaller vocabulary.
        """
        check_positive("max_tokens", max_tokens, 1)
        check_positive("seq_len", seq_len, 1)
        # Built from the vocabulary alone: no added tokens, which would be matched in the raw text
        # before normalization, so a review containing "[UNK]" would get id 1 where the guide
        # sees the word "unk".
        tokenizer = guide_tokenizer(ranked_vocabulary(count_words(standardize_all(texts)), max_tokens))
        set_fixed_length(tokenizer, seq_len)
        return cls(tokenizer)

    # --- using ------------------------------------------------------------------------------

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """(len(texts), seq_len) int64 ids; 0 pads the end, 1 marks out-of-vocabulary words."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list")
        if len(texts) == 0:
            return torch.zeros((0, self.seq_len), dtype=torch.int64)
        standardized = standardize_all(texts)
        ids = np.full((len(standardized), self.seq_len), PAD_ID, dtype=np.int64)
        rest = self._encode_in_python(standardized, ids) if self._lookup else list(range(len(standardized)))
        if rest:
            # encode_batch_fast runs on all cores and skips the character offsets nobody needs here.
            encodings = self._bare.encode_batch_fast([standardized[row] for row in rest], add_special_tokens=False)
            ids[rest] = np.array([encoding.ids for encoding in encodings], dtype=np.int64)
        return torch.from_numpy(ids)

    def _encode_in_python(self, standardized: Sequence[str], ids: np.ndarray) -> list[int]:
        """Fill the rows of texts that `splits_like_rust`; return the other rows, for the tokenizer.

        Keeps the first seq_len words, the rest of the row stays padding: the tokenizer's
        right-side truncation and padding, which `python_lookup` checked.
        """
        get, seq_len, rest = self._lookup.get, self.seq_len, []
        for row, text in enumerate(standardized):
            if splits_like_rust(text):
                words = text.split(None, seq_len)[:seq_len]  # at most seq_len + 1 pieces
                ids[row, : len(words)] = [get(word, OOV_ID) for word in words]
            else:
                rest.append(row)
        return rest

    def standardize(self, text: str) -> str:
        """The text as the vocabulary sees it, before the whitespace split."""
        return self.tokenizer.normalizer.normalize_str(text)

    @property
    def vocab_size(self) -> int:
        """Number of ids, "[PAD]" and "[UNK]" included: the Embedding's row count."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def seq_len(self) -> int:
        return self.tokenizer.padding["length"]

    def vocabulary(self) -> list[str]:
        """Token of each id, like Keras' get_vocabulary() (with "[PAD]" where Keras has "")."""
        by_id = sorted((i, token) for token, i in self.tokenizer.get_vocab().items())
        return [token for _, token in by_id]

    # --- files ------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write tokenizer.json (at `path`, or inside it when it is a folder) atomically."""
        path = tokenizer_path(Path(path))
        atomic_write_text(path, self.tokenizer.to_str(pretty=True))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> TextVectorizer:
        """Read a tokenizer.json written by `save` (a file, or a folder holding one)."""
        path = tokenizer_path(Path(path))
        if not path.is_file():
            raise UserError(f"{path} not found; fit a TextVectorizer and save it there first")
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception for bad JSON
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"{path} is not a valid tokenizer.json ({reason}); delete it and fit again") from exc
        problem = vectorizer_problem(tokenizer)
        if problem:
            raise UserError(f"{path} is not a TextVectorizer file ({problem}); delete it and fit again")
        return cls(tokenizer)


def python_lookup(tokenizer: Tokenizer) -> dict[str, int] | None:
    """The vocabulary for encoding in Python, or None when this tokenizer's ids could differ from it.

    A word-level model with right-side truncation and padding and no added tokens maps each word
    to `vocab.get(word, OOV_ID)`; anything else (a hand-edited tokenizer.json) keeps the library path.
    """
    padding, truncation = tokenizer.padding or {}, tokenizer.truncation or {}
    if (not isinstance(tokenizer.model, WordLevel) or tokenizer.get_added_tokens_decoder()
            or padding.get("direction") != "right" or truncation.get("direction") != "right"
            or tokenizer.token_to_id(OOV_TOKEN) != OOV_ID):
        return None
    return tokenizer.get_vocab()


def tokenizer_path(path: Path) -> Path:
    return path / TOKENIZER_FILE if path.is_dir() else path


def vectorizer_problem(tokenizer: Tokenizer) -> str | None:
    """Why `tokenizer` cannot serve as a TextVectorizer, or None."""
    padding = tokenizer.padding
    if not padding or not padding.get("length"):
        return "no fixed-length padding"
    if padding.get("pad_id") != PAD_ID:
        return f"padding id is {padding.get('pad_id')}, expected {PAD_ID}"
    if tokenizer.token_to_id(PAD_TOKEN) != PAD_ID or tokenizer.token_to_id(OOV_TOKEN) != OOV_ID:
        return f"{PAD_TOKEN} and {OOV_TOKEN} must have ids {PAD_ID} and {OOV_ID}"
    if not tokenizer.truncation or tokenizer.truncation.get("max_length") != padding["length"]:
        return "truncation length differs from the padding length"
    return None
