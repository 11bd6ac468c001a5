"""IMDB reader (aclImdb folder or streamed .tar.gz) and the guide's TextVectorization on tokenizers."""

from __future__ import annotations

import random
import re
import socket
import string
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from tokenizers.trainers import WordLevelTrainer

from conftest import shared_data
from helpers.datasets import tar_folder
from inceptionlab.data.datasets import imdb
from inceptionlab.data.datasets.imdb import CLASS_NAMES, download_imdb, load_imdb, load_imdb_splits
from inceptionlab.data.text import child_reader
from inceptionlab.data.text.vectorizer import (OOV_ID, PAD_ID, StandardizedTexts, TextVectorizer, splits_like_rust,
                                    standardize_all)
from inceptionlab.errors import UserError

SEQ_LEN = 250
PUNCTUATION = re.compile("[%s]" % re.escape(string.punctuation))


# --- the guide's code, restated in plain Python as the reference ------------------------------


def guide_standardize(text: str) -> str:
    """custom_standardization from the guide: lowercase, "<br />" -> " ", strip punctuation."""
    lowercase = text.lower()
    stripped_html = re.sub("<br />", " ", lowercase)
    return PUNCTUATION.sub("", stripped_html)


def guide_ids(text: str, vocab: dict[str, int], seq_len: int = SEQ_LEN) -> list[int]:
    """What TextVectorization(output_mode="int", output_sequence_length=seq_len) returns."""
    ids = [vocab.get(word, OOV_ID) for word in guide_standardize(text).split()][:seq_len]
    return ids + [PAD_ID] * (seq_len - len(ids))


def guide_vocabulary(texts: list[str], max_tokens: int) -> list[str]:
    """Pad, OOV, then the max_tokens - 1 most frequent words; ties by word (code point order)."""
    counts = Counter(word for text in texts for word in guide_standardize(text).split())
    ranked = sorted(counts, key=lambda word: (-counts[word], word))
    return ["[PAD]", "[UNK]"] + ranked[: max_tokens - 1]


TRICKY = [
    "Hello, World!",
    "One<br />two<br /><br />three",
    "<BR />Caps tag is lowercased first, so it is replaced too",
    "<br/>without the space is not a tag: only its punctuation goes",
    "don't  stop -- it's 100% {great} [really]",
    "C++ & C# && a||b ~`^ \\back\\slash/ \"quoted\" 'single' @home $5 *star* _under_",
    "tabs\tand\nnewlines\r\nand   runs   of spaces",
    "[PAD] [UNK] are words here",
    "ÉCOLE Café naïve — “curly” quotes… ¿qué?",
    "",
    "   ",
    "!!!???...",
]


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def subset_root(imdb_root) -> Path:
    """Reviews in aclImdb's layout written by the tests (conftest.py, helpers/datasets.py): punctuation,
    <br /> tags, capitals, non-ASCII, and reviews longer than the 250-token sequences."""
    return imdb_root


@pytest.fixture(scope="module")
def subset(subset_root) -> dict[str, tuple[list[str], list[int]]]:
    return load_imdb_splits(subset_root)


@pytest.fixture(scope="module")
def real_subset_root() -> Path:
    return shared_data("imdb/aclImdb_subset")


@pytest.fixture(scope="module")
def real_subset(real_subset_root) -> dict[str, tuple[list[str], list[int]]]:
    return load_imdb_splits(real_subset_root)


@pytest.fixture(scope="module")
def subset_vectorizer(subset) -> TextVectorizer:
    return TextVectorizer.fit(subset["train"][0])


@pytest.fixture(scope="module")
def full_splits():
    archive = shared_data("imdb/aclImdb_labeled.tar.gz")
    start = time.perf_counter()
    splits = load_imdb_splits(archive)
    return splits, time.perf_counter() - start


def write_review(root: Path, relative: str, text: str | bytes) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))


@pytest.fixture
def tiny_acl(tmp_path) -> Path:
    """A miniature aclImdb, with the files a real one has that are not labelled reviews."""
    root = tmp_path / "data" / "aclImdb"
    for split in ("train", "test"):
        write_review(root, f"{split}/neg/10_2.txt", f"{split} neg ten")
        write_review(root, f"{split}/neg/9_1.txt", f"{split} neg nine")
        write_review(root, f"{split}/pos/3_8.txt", f"{split} pos three")
        write_review(root, f"{split}/urls_pos.txt", "http://www.imdb.com/title/tt0000001/")
    write_review(root, "train/unsup/0_0.txt", "unlabelled review that must be ignored")
    write_review(root, "train/pos/4_9.txt", b"bad byte \xff here")
    write_review(root, "imdb.vocab", "the\nand\n")
    return root


def tar_gz(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return archive


# --- standardization ---------------------------------------------------------------------------


def test_punctuation_pattern_removes_exactly_string_punctuation(subset_vectorizer):
    characters = [chr(c) for c in range(0x250)] + list("…“”‘’¿¡—–«»·•€£")
    for character in characters:
        expected = "" if character in string.punctuation else character.lower()
        assert subset_vectorizer.standardize(character) == expected, repr(character)


@pytest.mark.parametrize("text", TRICKY)
def test_standardize_matches_guide_on_tricky_text(subset_vectorizer, text):
    assert subset_vectorizer.standardize(text) == guide_standardize(text)


MIXED = [*TRICKY, "".join(chr(c) for c in range(128)), "ΟΔΟΣ Σ σς final sigma", "tab\x0bvertical\x1cfile-sep\x85nel"]


def test_fast_ascii_standardization_equals_the_normalizer(subset_vectorizer):
    # standardize_all takes a Python path for ASCII texts; it must give the normalizer's output exactly.
    fast = standardize_all(MIXED)
    assert isinstance(fast, StandardizedTexts)
    assert list(fast) == [subset_vectorizer.standardize(text) for text in MIXED]
    assert sum(text.isascii() for text in MIXED) >= 3 and not all(text.isascii() for text in MIXED)


def test_standardized_texts_give_the_ids_and_vocabulary_of_raw_texts(subset, subset_vectorizer):
    texts = subset["test"][0][:50] + MIXED
    plain = Tokenizer.from_str(subset_vectorizer.tokenizer.to_str())  # normalizes inside, like a user's copy
    expected = [encoding.ids for encoding in plain.encode_batch(texts)]
    assert subset_vectorizer.encode(texts).tolist() == expected
    assert subset_vectorizer.encode(standardize_all(texts)).tolist() == expected
    refit = TextVectorizer.fit(standardize_all(subset["train"][0]))
    assert refit.vocabulary() == subset_vectorizer.vocabulary()


def test_python_split_is_used_only_where_it_equals_the_tokenizers_split():
    # Every code point: which ones WhitespaceSplit splits on, found 20,000 at a time between "x"s.
    characters = [chr(code) for code in range(sys.maxunicode + 1) if not 0xD800 <= code <= 0xDFFF]
    splitter, rust_whitespace = pre_tokenizers.WhitespaceSplit(), set()
    for start in range(0, len(characters), 20_000):
        chunk = characters[start : start + 20_000]
        kept = "".join(word for word, _ in splitter.pre_tokenize_str("x" + "x".join(chunk) + "x"))
        rust_whitespace |= set(chunk) - set(kept)
    python_whitespace = {character for character in characters if character.isspace()}
    assert python_whitespace - rust_whitespace == set("\x1c\x1d\x1e\x1f") and rust_whitespace <= python_whitespace
    assert [splits_like_rust(f"a{c}b") for c in "\x1b\x1c\x1f\x20\x85\u3000"] == [True, False, False, True, True, True]


def test_python_encoding_equals_the_tokenizer_at_every_length(subset, subset_vectorizer):
    words = "the movie was fine zebraword and then".split()
    texts = [" ".join(words * 40)[:n] + tail for n in (0, 1, 5, 300, 1400, 2000) for tail in ("", "  ", " \x1c x", " é")]
    texts += [" ".join(["w"] * n) for n in (249, 250, 251)] + subset["test"][0][:200] + MIXED
    plain = Tokenizer.from_str(subset_vectorizer.tokenizer.to_str())
    assert subset_vectorizer.encode(texts).tolist() == [e.ids for e in plain.encode_batch(texts)]
    assert sum(splits_like_rust(t) for t in standardize_all(texts)) > len(texts) // 2  # the fast path ran


def test_a_tokenizer_the_python_path_cannot_mirror_is_encoded_by_the_library(subset, subset_vectorizer):
    edited = Tokenizer.from_str(subset_vectorizer.tokenizer.to_str())
    edited.enable_truncation(max_length=SEQ_LEN, direction="left")  # keeps the last words instead
    vectorizer = TextVectorizer(edited)
    long_reviews = [text for text in subset["test"][0] if len(text.split()) > 2 * SEQ_LEN][:20]
    assert long_reviews and vectorizer._lookup is None
    ids = vectorizer.encode(long_reviews)
    assert ids.tolist() == [e.ids for e in edited.encode_batch(long_reviews)]
    assert not torch.equal(ids, subset_vectorizer.encode(long_reviews))


def test_python_vocabulary_equals_tokenizers_word_level_trainer(subset):
    texts = standardize_all(subset["train"][0] + MIXED + ["b a", "a b", "\x1cx y\x1c"])
    for max_tokens in (3, 50, 10_000):
        trainer = WordLevelTrainer(vocab_size=max_tokens + 1, special_tokens=["[PAD]", "[UNK]"], show_progress=False)
        library = Tokenizer(WordLevel(unk_token="[UNK]"))  # counts words of standardized texts
        library.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        library.train_from_iterator(texts, trainer=trainer)
        assert TextVectorizer.fit(texts, max_tokens=max_tokens).tokenizer.get_vocab() == library.get_vocab()


def test_br_tag_is_replaced_after_lowercasing_as_in_the_guide(subset_vectorizer):
    assert subset_vectorizer.standardize("a<BR />b<br />c<br/>d") == "a b cbrd"


def test_standardize_and_ids_match_guide_on_written_reviews(subset, subset_vectorizer):
    texts = subset["train"][0] + subset["test"][0]
    assert_matches_guide(texts, subset_vectorizer)


def test_standardize_and_ids_match_guide_on_200_real_reviews(real_subset):
    texts = real_subset["train"][0][::5][:200]  # both labels: neg is the first half, pos the second
    assert len(texts) == 200
    assert_matches_guide(texts, TextVectorizer.fit(real_subset["train"][0]))


def assert_matches_guide(texts: list[str], vectorizer: TextVectorizer) -> None:
    vocab = vectorizer.tokenizer.get_vocab()
    encoded = vectorizer.encode(texts).tolist()
    for text, ids in zip(texts, encoded):
        assert vectorizer.standardize(text) == guide_standardize(text)
        assert ids == guide_ids(text, vocab)


# --- vocabulary --------------------------------------------------------------------------------


def test_vocabulary_follows_the_rule_on_the_subset(subset, subset_vectorizer):
    texts = subset["train"][0]
    expected = guide_vocabulary(texts, max_tokens=10_000)
    assert subset_vectorizer.vocabulary() == expected
    distinct = len(expected) - 2
    assert subset_vectorizer.vocab_size == 2 + min(distinct, 9_999)


def test_small_budget_keeps_most_frequent_words_with_ties_by_word(subset):
    texts = subset["train"][0][:300]
    vectorizer = TextVectorizer.fit(texts, max_tokens=50, seq_len=20)
    assert vectorizer.vocab_size == 51
    assert vectorizer.vocabulary() == guide_vocabulary(texts, max_tokens=50)
    assert vectorizer.seq_len == 20


def test_ties_in_frequency_are_broken_by_word():
    vectorizer = TextVectorizer.fit(["delta charlie bravo alpha", "echo echo"], max_tokens=4)
    assert vectorizer.vocabulary() == ["[PAD]", "[UNK]", "echo", "alpha", "bravo"]


def test_fit_is_deterministic_whatever_the_text_order(subset):
    texts = subset["train"][0]
    shuffled = random.Random(0).sample(texts, len(texts))
    first, second = TextVectorizer.fit(texts), TextVectorizer.fit(shuffled)
    assert first.tokenizer.get_vocab() == second.tokenizer.get_vocab()
    assert first.tokenizer.to_str() == second.tokenizer.to_str()


def test_bad_budget_is_a_user_error():
    with pytest.raises(UserError, match="max_tokens"):
        TextVectorizer.fit(["a b"], max_tokens=0)
    with pytest.raises(UserError, match="seq_len"):
        TextVectorizer.fit(["a b"], seq_len=0)


# --- encoding ----------------------------------------------------------------------------------


def test_pads_at_the_end_truncates_at_the_end_and_marks_unknown_words():
    vectorizer = TextVectorizer.fit(["the cat sat on the mat"] * 3 + ["a dog"])
    vocab = vectorizer.tokenizer.get_vocab()
    long_text = " ".join(["cat", "dog"] * 200)  # 400 words
    ids = vectorizer.encode(["The cat, zebra!", long_text, ""])
    assert ids.dtype == torch.int64 and ids.shape == (3, SEQ_LEN)
    assert ids[0, :3].tolist() == [vocab["the"], vocab["cat"], OOV_ID]
    assert (ids[0, 3:] == PAD_ID).all()
    assert ids[1].tolist() == [vocab["cat"], vocab["dog"]] * (SEQ_LEN // 2)  # the first 250 words
    assert (ids[2] == PAD_ID).all()


def test_special_token_text_is_an_ordinary_word():
    # Keras would see "[PAD]" as the word "pad"; it must not become the padding id.
    vectorizer = TextVectorizer.fit(["pad unk pad"])
    ids = vectorizer.encode(["[PAD] [UNK] x"])[0, :3].tolist()
    assert ids == [vectorizer.tokenizer.token_to_id("pad"), vectorizer.tokenizer.token_to_id("unk"), OOV_ID]


def test_encode_edge_inputs(subset_vectorizer):
    assert subset_vectorizer.encode([]).shape == (0, SEQ_LEN)
    with pytest.raises(TypeError, match="list of texts"):
        subset_vectorizer.encode("a single string")


# --- files -------------------------------------------------------------------------------------


def test_save_load_round_trip_and_plain_tokenizers_give_equal_ids(subset, subset_vectorizer, tmp_path):
    texts = subset["test"][0][:100] + TRICKY
    expected = subset_vectorizer.encode(texts)
    written = subset_vectorizer.save(tmp_path)  # a folder: tokenizer.json goes inside
    assert written == tmp_path / "tokenizer.json"
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temporary left behind

    loaded = TextVectorizer.load(tmp_path)
    assert torch.equal(loaded.encode(texts), expected)
    assert loaded.vocab_size == subset_vectorizer.vocab_size and loaded.seq_len == SEQ_LEN

    plain = Tokenizer.from_file(str(written))  # no inceptionlab code involved
    plain_ids = [encoding.ids for encoding in plain.encode_batch(texts)]
    assert plain_ids == expected.tolist()


def test_save_replaces_an_existing_file(subset_vectorizer, tmp_path):
    path = tmp_path / "vectorizer.json"
    TextVectorizer.fit(["other words"]).save(path)
    subset_vectorizer.save(path)
    assert TextVectorizer.load(path).vocab_size == subset_vectorizer.vocab_size


def test_load_missing_or_corrupt_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        TextVectorizer.load(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="not a valid tokenizer.json"):
        TextVectorizer.load(broken)
    vectorizer = TextVectorizer.fit(["a b"])
    vectorizer.tokenizer.no_padding()
    unpadded = vectorizer.save(tmp_path / "unpadded.json")
    with pytest.raises(UserError, match="no fixed-length padding"):
        TextVectorizer.load(unpadded)


# --- reading IMDB ------------------------------------------------------------------------------


def assert_reads_by_label(root: Path, splits: dict, per_label: int) -> None:
    """Both splits hold `per_label` reviews of each label, sorted by path (neg/ before pos/), none
    empty, and the aclImdb folder itself reads the same as its parent."""
    for split in ("train", "test"):
        texts, labels = splits[split]
        assert len(texts) == 2 * per_label
        assert labels == [0] * per_label + [1] * per_label
        assert all(texts)
    assert load_imdb(root / "aclImdb", "test") == splits["test"]


def test_written_reviews_load_by_label_and_the_aclimdb_folder_itself(subset_root, subset):
    assert_reads_by_label(subset_root, subset, per_label=24)


def test_written_archive_reads_like_its_folder(subset_root, subset, tmp_path):
    archive = tar_folder(subset_root / "aclImdb", tmp_path / "aclImdb_v1.tar.gz")  # one top folder, as shipped
    assert load_imdb_splits(archive) == subset


def test_real_subset_counts_match_provenance(real_subset_root, real_subset):
    assert_reads_by_label(real_subset_root, real_subset, per_label=500)


def test_full_archive_has_25000_reviews_per_split(full_splits, real_subset, capsys):
    splits, seconds = full_splits
    for split in ("train", "test"):
        texts, labels = splits[split]
        assert len(texts) == 25_000
        assert Counter(labels) == {0: 12_500, 1: 12_500}
        assert set(real_subset[split][0]) <= set(texts)  # the subset's files are byte-identical members
    with capsys.disabled():
        print(f"\nIMDB: read both splits of aclImdb_labeled.tar.gz in one pass: {seconds:.2f} s")


def test_folder_and_archive_give_the_same_ordered_reviews_without_unsup(tiny_acl, tmp_path):
    from_folder = load_imdb_splits(tiny_acl.parent)  # a folder holding aclImdb/
    from_archive = load_imdb_splits(tar_gz(tiny_acl, tmp_path / "aclImdb_tiny.tar.gz"))
    assert from_folder == from_archive
    texts, labels = from_folder["train"]
    # relative-path order: neg/10_2 < neg/9_1 < pos/3_8 < pos/4_9 (string order, as documented)
    assert texts == ["train neg ten", "train neg nine", "train pos three", "bad byte \ufffd here"]
    assert labels == [0, 0, 1, 1]
    assert not any("unlabelled" in text for text in texts + from_folder["test"][0])
    assert CLASS_NAMES == ["neg", "pos"]


def test_missing_or_empty_folders_are_user_errors(tiny_acl, tmp_path):
    for path in sorted((tiny_acl / "test" / "pos").iterdir()):
        path.unlink()
    with pytest.raises(UserError, match="no .txt reviews"):
        load_imdb(tiny_acl, "test")
    (tiny_acl / "test" / "pos").rmdir()
    with pytest.raises(UserError, match=r"test/pos is missing"):
        load_imdb(tiny_acl, "test")
    assert load_imdb(tiny_acl, "train")[1] == [0, 0, 1, 1]  # the other split still reads
    with pytest.raises(UserError, match=r"has no aclImdb/test/pos"):
        load_imdb(tar_gz(tiny_acl, tmp_path / "partial.tar.gz"), "test")
    with pytest.raises(UserError, match="not found"):
        load_imdb(tmp_path / "nowhere", "train")
    with pytest.raises(UserError, match="does not exist"):
        load_imdb(tiny_acl, "unsup")


def test_corrupt_archive_is_a_user_error(tmp_path):
    archive = tmp_path / "aclImdb_v1.tar.gz"
    archive.write_bytes(b"\x1f\x8b\x08\x00" + bytes(100))
    with pytest.raises(UserError, match="not a readable tar archive"):
        load_imdb(archive, "train")


def test_download_offline_names_the_file_to_put_there(tmp_path, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on: the connection is refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(imdb, "IMDB_URL", f"http://127.0.0.1:{port}/aclImdb_v1.tar.gz")
    with pytest.raises(UserError) as caught:
        download_imdb(tmp_path, progress=False)
    assert str(tmp_path / "aclImdb_v1.tar.gz") in str(caught.value)
    assert imdb.IMDB_MD5 in str(caught.value)


def test_download_to_an_archive_path_writes_that_file_not_a_folder_of_that_name(tmp_path, monkeypatch):
    fetched = []

    def fake_fetch(url, dest, md5, progress):
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"archive")
        fetched.append(dest)
        return dest

    monkeypatch.setattr(imdb, "fetch", fake_fetch)
    archive = tmp_path / "data" / "imdb" / "aclImdb_v1.tar.gz"
    assert download_imdb(archive, progress=False) == archive and archive.is_file()
    assert download_imdb(tmp_path / "folder", progress=False) == tmp_path / "folder" / "aclImdb_v1.tar.gz"
    assert fetched == [archive, tmp_path / "folder" / "aclImdb_v1.tar.gz"]


# --- timing (printed, not asserted) ------------------------------------------------------------


def test_fit_and_encode_full_train_split(full_splits, capsys):
    texts, _ = full_splits[0]["train"]
    start = time.perf_counter()
    vectorizer = TextVectorizer.fit(texts)
    fitted = time.perf_counter()
    ids = vectorizer.encode(texts)
    encoded = time.perf_counter()
    assert vectorizer.vocab_size == 10_001  # 25,000 reviews hold far more than 9,999 words
    assert ids.shape == (25_000, SEQ_LEN)
    with capsys.disabled():
        print(
            f"\nIMDB train (25,000 reviews): fit {fitted - start:.2f} s, encode {encoded - fitted:.2f} s,"
            f" vocab_size {vectorizer.vocab_size}"
        )


# --- the reading worker process ----------------------------------------------------------------


@pytest.fixture
def worker_for_any_size(monkeypatch):
    """The child process for the tiny test data too (it only starts for real-size data by default)."""
    monkeypatch.setattr(child_reader, "WORKER_MIN_ARCHIVE_BYTES", 0)
    monkeypatch.setattr(child_reader, "WORKER_MIN_FILES_PER_CLASS", 1)
    started = []
    real_popen = child_reader.subprocess.Popen
    monkeypatch.setattr(child_reader.subprocess, "Popen", lambda *a, **k: started.append(a[0]) or real_popen(*a, **k))
    return started


def test_the_worker_reads_what_this_process_reads(tiny_acl, tmp_path, worker_for_any_size):
    for source in (tiny_acl, tar_gz(tiny_acl, tmp_path / "aclImdb_tiny.tar.gz")):
        in_worker = child_reader.read_standardized_in_worker(source)
        assert in_worker == child_reader.read_standardized(source)
        assert isinstance(in_worker["train"][0], StandardizedTexts) and in_worker["train"][1] == [0, 0, 1, 1]
        assert in_worker["train"][0][3] == "bad byte \ufffd here"  # decoded and standardized in the child
    assert len(worker_for_any_size) == 2 and worker_for_any_size[0][1:3] == ["-m", "inceptionlab.data.text.child_reader"]


def test_a_bad_archive_is_reported_from_the_worker_in_one_line(tmp_path, worker_for_any_size):
    archive = tmp_path / "aclImdb_v1.tar.gz"
    archive.write_bytes(b"\x1f\x8b\x08\x00" + b"not really gzip" * 10)
    with pytest.raises(UserError, match="not a readable tar archive") as caught:
        child_reader.read_standardized_in_worker(archive)
    assert str(archive) in str(caught.value) and "\n" not in str(caught.value)
    assert worker_for_any_size  # the error came through the child


def test_a_worker_that_cannot_run_leaves_the_reading_to_this_process(tiny_acl, monkeypatch, worker_for_any_size):
    expected = child_reader.read_standardized(tiny_acl)
    monkeypatch.setattr(child_reader.sys, "executable", "/bin/false")  # starts, exits 1, writes nothing
    assert child_reader.read_standardized_in_worker(tiny_acl) == expected
    monkeypatch.setattr(child_reader.sys, "executable", str(tiny_acl / "no-such-python"))  # cannot start
    assert child_reader.read_standardized_in_worker(tiny_acl) == expected
    assert len(worker_for_any_size) == 2


def test_small_data_is_read_without_a_worker(tiny_acl, tmp_path, monkeypatch):
    monkeypatch.setattr(child_reader.subprocess, "Popen", lambda *a, **k: pytest.fail("no child for 3 reviews per class"))
    assert child_reader.read_standardized_in_worker(tiny_acl)["test"][1] == [0, 0, 1]
    assert child_reader.read_standardized_in_worker(tar_gz(tiny_acl, tmp_path / "small.tar.gz"))["test"][1] == [0, 0, 1]
    big = tmp_path / "big.tar.gz"
    with big.open("wb") as sparse:
        sparse.truncate(child_reader.WORKER_MIN_ARCHIVE_BYTES)  # the size alone decides
    assert child_reader.worth_a_worker(big)
