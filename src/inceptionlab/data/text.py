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

Known differences from the TensorFlow code, all on non-ASCII text only:
- `tf.strings.lower` lowercases ASCII only; `Lowercase()` lowercases every script ("É" -> "é";
  50 of the 50,000 IMDB reviews hold such a capital). It maps character by character, so a
  final Greek capital sigma becomes "σ" where Python's str.lower gives "ς".
- `tf.strings.split` splits on ASCII whitespace; `WhitespaceSplit()` on Unicode whitespace too.
  In IMDB that is U+0085 (a cp1252 "…" decoded as Latin-1, 1,479 times) and U+00A0: 692 of the
  50,000 reviews, where "well" U+0085 "i" gives the words "well", "i" instead of one rare token.
"""

from __future__ import annotations

import itertools
import os
import re
import string
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_text

PAD_TOKEN, PAD_ID = "[PAD]", 0
OOV_TOKEN, OOV_ID = "[UNK]", 1
DEFAULT_MAX_TOKENS = 10_000  # the guide's max_features
DEFAULT_SEQ_LEN = 250  # the guide's sequence_length
TOKENIZER_FILE = "tokenizer.json"

# The guide's own expression. re.escape escapes every character of string.punctuation, and each
# escape is a literal in Oniguruma (the tokenizers regex engine) too; "&&", which Oniguruma would
# read as class intersection, cannot occur because "&" is escaped.
PUNCTUATION_PATTERN = "[%s]" % re.escape(string.punctuation)
_PUNCTUATION = re.compile(PUNCTUATION_PATTERN)


class StandardizedTexts(list):
    """Texts already standardized (`standardize_all`): fit and encode skip that step."""


def standardize_ascii(text: str) -> str:
    """`guide_normalizer()` for an ASCII text, in Python.

    On ASCII, str.lower and Lowercase() agree, and Python's re and Oniguruma match the same
    characters of the escaped class. In Python this is 0.33 s for IMDB's 25,000 training reviews
    on one core, against 1.7 CPU s for the normalizer inside `encode_batch_fast` (AMD EPYC).
    """
    return _PUNCTUATION.sub("", text.lower().replace("<br />", " "))


def guide_normalizer() -> normalizers.Normalizer:
    # Same order as the guide. Lowercasing first cannot hide a "<br />" (it has no letters that
    # change), and it turns "<BR />" into "<br />" exactly as tf.strings.lower does before the
    # guide's replace.
    return normalizers.Sequence(
        [
            normalizers.Lowercase(),
            normalizers.Replace("<br />", " "),
            normalizers.Replace(Regex(PUNCTUATION_PATTERN), ""),
        ]
    )


def guide_tokenizer(vocab: dict[str, int] | None = None) -> Tokenizer:
    """Normalizer + whitespace split + word-level model; an empty model when `vocab` is None."""
    model = WordLevel(vocab, unk_token=OOV_TOKEN) if vocab is not None else WordLevel(unk_token=OOV_TOKEN)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = guide_normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def standardize_all(texts: Iterable[str]) -> StandardizedTexts:
    """Each text as `guide_normalizer()` leaves it: ASCII texts in Python, the rest by the normalizer.

    IMDB: 22,653 of the 25,000 training reviews are ASCII. The non-ASCII ones keep the normalizer's
    Unicode rules (see the module docstring), so the ids equal those of the saved tokenizer.json.
    StandardizedTexts are returned as they are.
    """
    if isinstance(texts, StandardizedTexts):
        return texts
    normalizer = guide_normalizer()
    return StandardizedTexts(
        standardize_ascii(text) if text.isascii() else normalizer.normalize_str(text) for text in texts
    )


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
        trainer = WordLevelTrainer(
            vocab_size=max_tokens + 1,
            min_frequency=1,
            special_tokens=[PAD_TOKEN, OOV_TOKEN],
            show_progress=False,
        )
        standardized = standardize_all(texts)
        counting = guide_tokenizer()
        counting.normalizer = None  # it counts words of standardized texts
        counting.train_from_iterator(standardized, trainer=trainer, length=len(standardized))
        # Rebuild from the learnt vocabulary: training also registered "[PAD]"/"[UNK]" as added
        # tokens, which would be matched in the raw text before normalization, so a review
        # containing "[UNK]" would get id 1 where the guide sees the word "unk".
        tokenizer = guide_tokenizer(counting.get_vocab())
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
        # encode_batch_fast runs on all cores and skips the character offsets nobody needs here.
        encodings = self._bare.encode_batch_fast(standardized, add_special_tokens=False)
        # Every encoding has exactly seq_len ids, so one flat fromiter with a known count fills
        # the array directly (about twice as fast as np.array over a list of lists).
        flat = itertools.chain.from_iterable(encoding.ids for encoding in encodings)
        ids = np.fromiter(flat, dtype=np.int64, count=len(encodings) * self.seq_len)
        return torch.from_numpy(ids.reshape(len(encodings), self.seq_len))

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
