"""Readers of the original file formats: Fashion-MNIST/MNIST idx files and CIFAR-10 pickles.

Every test runs on files written here in the original formats (helpers/datasets.py), the restricted
unpickler's refusals included. The real files are an extra layer: the complete Fashion-MNIST in
../shared/data/fashion-mnist, and CIFAR-10 batches built from the 200 real training images there
(Kaggle PNGs = the first 200 images of data_batch_1) with the real `batches.meta`.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import shutil
import struct
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import shared_data
from helpers.cifar_writers import write_cifar10_meta
from helpers.datasets import cifar10_images, pattern_images, write_cifar10
from PIL import Image

from inceptionlab.data.datasets import cifar10, mnist
from inceptionlab.data.datasets.cifar10 import load_cifar10
from inceptionlab.data.datasets.mnist import load_idx_split, read_idx
from inceptionlab.data.io.archives import safe_extract_tar
from inceptionlab.data.io.download import DownloadError
from inceptionlab.errors import UserError

CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
T10K = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# --- Fashion-MNIST / MNIST (idx) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fashion_dir(fashion_root) -> Path:
    return fashion_root


@pytest.fixture(scope="module")
def fashion_test(fashion_dir):
    return load_idx_split(fashion_dir, "test")


def test_written_idx_files_load_back_exactly(fashion_dir):
    train = load_idx_split(fashion_dir, "train")
    labels = (np.arange(300) % 10)
    assert train.inputs.shape == (300, 1, 28, 28) and train.inputs.dtype == torch.uint8
    assert train.targets.dtype == torch.int64 and train.targets.tolist() == labels.tolist()
    assert np.array_equal(train.inputs[:, 0].numpy(), pattern_images(labels, seed=0))
    assert train.class_names == mnist.FASHION_CLASSES
    test = load_idx_split(fashion_dir, "test")
    assert test.targets[0] == 9 and test.class_names[test.targets[0]] == "Ankle boot" and len(test) == 100


@pytest.fixture(scope="module")
def real_fashion_train():
    start = time.perf_counter()
    split = load_idx_split(shared_data("fashion-mnist"), "train")
    return split, time.perf_counter() - start


def test_real_fashion_train_is_complete_balanced_and_fast(real_fashion_train):
    split, seconds = real_fashion_train
    assert split.inputs.shape == (60_000, 1, 28, 28) and split.inputs.dtype == torch.uint8
    assert split.targets.shape == (60_000,) and split.targets.dtype == torch.int64
    assert torch.bincount(split.targets).tolist() == [6_000] * 10
    # The first labels of the official file: Ankle boot, T-shirt/top, T-shirt/top, Dress, ...
    assert split.targets[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert split.class_names[split.targets[0]] == "Ankle boot"
    assert split.class_names == mnist.FASHION_CLASSES
    assert split.inputs.max() == 255 and split.inputs.min() == 0
    assert seconds < 5, f"loading 60,000 images took {seconds:.2f} s"


def test_real_fashion_test_split():
    real_test = load_idx_split(shared_data("fashion-mnist"), "test")
    assert real_test.inputs.shape == (10_000, 1, 28, 28)
    assert torch.bincount(real_test.targets).tolist() == [1_000] * 10
    assert real_test.targets[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]


def gunzip_t10k(fashion_dir: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in T10K:
        (dest / name).write_bytes(gzip.decompress((fashion_dir / f"{name}.gz").read_bytes()))
    return dest


def test_uncompressed_files_give_identical_tensors(fashion_dir, fashion_test, tmp_path):
    folder = gunzip_t10k(fashion_dir, tmp_path / "plain")
    plain = load_idx_split(folder, "test")
    assert torch.equal(plain.inputs, fashion_test.inputs)
    assert torch.equal(plain.targets, fashion_test.targets)
    # With both present the plain file is read: a broken .gz beside it does not matter.
    (folder / f"{T10K[0]}.gz").write_bytes(b"\x1f\x8b broken")
    assert torch.equal(load_idx_split(folder, "test").inputs, fashion_test.inputs)


def test_raw_subfolder_and_mnist_class_names(fashion_dir, fashion_test, tmp_path):
    raw = tmp_path / "raw"  # torchvision's layout
    raw.mkdir()
    for name in T10K:
        shutil.copy(fashion_dir / f"{name}.gz", raw)
    digits = load_idx_split(tmp_path, "test", dataset="mnist")
    assert digits.class_names == [str(d) for d in range(10)]
    assert torch.equal(digits.targets, fashion_test.targets)


def test_truncated_files_are_refused(fashion_dir, tmp_path):
    folder = gunzip_t10k(fashion_dir, tmp_path)
    images = folder / T10K[0]
    images.write_bytes(images.read_bytes()[:-100])
    with pytest.raises(UserError, match=rf"{T10K[0]} is truncated"):
        load_idx_split(folder, "test")
    labels_gz = tmp_path / "cut" / f"{T10K[1]}.gz"
    labels_gz.parent.mkdir()
    whole = (fashion_dir / f"{T10K[1]}.gz").read_bytes()
    labels_gz.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(UserError, match=rf"{T10K[1]}.gz is a truncated or corrupt gzip"):
        read_idx(labels_gz)


def test_wrong_magic_is_not_an_idx_file(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    path.write_bytes(b"PK\x03\x04" + bytes(20))
    with pytest.raises(UserError, match="not an idx file") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def test_count_mismatch_names_both_files(fashion_dir, tmp_path):
    shutil.copy(fashion_dir / f"{T10K[0]}.gz", tmp_path)
    (tmp_path / T10K[1]).write_bytes(idx_bytes(np.zeros(99, np.uint8), 0x08))
    with pytest.raises(UserError, match="100 images but .* has 99 labels") as info:
        load_idx_split(tmp_path, "test")
    assert T10K[0] in str(info.value) and T10K[1] in str(info.value)


@pytest.mark.parametrize("code,dtype", [(0x09, "i1"), (0x0B, "i2"), (0x0C, "i4"), (0x0D, "f4"), (0x0E, "f8")])
def test_read_idx_other_types_big_endian(tmp_path, code, dtype):
    values = (np.arange(24) - 12).reshape(2, 3, 4).astype(dtype)
    path = tmp_path / "values.idx"
    path.write_bytes(idx_bytes(values, code))
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative and out.flags.writeable
    np.testing.assert_array_equal(out, values)


def test_missing_idx_files_and_offline_download(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="train-images-idx3-ubyte.*not found"):
        load_idx_split(tmp_path, "train")

    def offline(url, dest, **kwargs):
        raise DownloadError(url, Path(dest), "network unreachable")

    monkeypatch.setattr(mnist, "fetch", offline)
    with pytest.raises(UserError, match="could not download train-images-idx3-ubyte.gz") as info:
        load_idx_split(tmp_path, "train", download=True)
    assert str(tmp_path) in str(info.value)


# --- CIFAR-10 (pickled batches) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def kaggle_images():
    """200 images as uint8 (200, 3, 32, 32) and their labels: classes by colour (helpers/datasets.py)."""
    return cifar10_images()


@pytest.fixture
def cifar_root(tmp_path, kaggle_images) -> Path:
    return write_cifar10(tmp_path, *kaggle_images)


def test_cifar_batches_load_back_to_the_written_pixels(cifar_root, kaggle_images):
    images, labels = kaggle_images
    train = load_cifar10(cifar_root, "train")
    assert train.inputs.shape == (150, 3, 32, 32) and train.inputs.dtype == torch.uint8
    assert np.array_equal(train.inputs.numpy(), images[:150])
    assert train.targets.dtype == torch.int64 and train.targets.tolist() == labels[:150]
    assert train.class_names == CIFAR_CLASSES  # read from batches.meta
    test = load_cifar10(cifar_root / "cifar-10-batches-py", "test")  # the folder itself works too
    assert np.array_equal(test.inputs.numpy(), images[150:])
    assert test.targets.tolist() == labels[150:]


def test_real_cifar_pixels_and_meta_round_trip(tmp_path):
    """The 200 real PNGs (trainLabels.csv: `n.png,name`) through batches written with the real batches.meta."""
    real = shared_data("cifar-10")
    folder = real / "kaggle_train_first200"
    rows = [line.split(",") for line in (folder / "trainLabels.csv").read_text().split()]
    images = np.stack([np.asarray(Image.open(folder / "train" / name).convert("RGB")) for name, _ in rows])
    images = images.transpose(0, 3, 1, 2).copy()
    labels = [CIFAR_CLASSES.index(label) for _, label in rows]
    write_cifar10(tmp_path, images, labels)
    shutil.copy(real / "cifar-10-batches-py" / "batches.meta", tmp_path / "cifar-10-batches-py" / "batches.meta")
    train = load_cifar10(tmp_path, "train")
    assert np.array_equal(train.inputs.numpy(), images[:150]) and train.targets.tolist() == labels[:150]
    # Known start of the CIFAR-10 training labels: frog truck truck deer automobile.
    assert train.targets[:5].tolist() == [6, 9, 9, 4, 1]
    assert train.class_names == CIFAR_CLASSES  # read from the real batches.meta


def test_write_cifar10_meta_round_trips(tmp_path):
    write_cifar10_meta(tmp_path / "batches.meta", CIFAR_CLASSES)
    assert cifar10.read_label_names(tmp_path / "batches.meta") == CIFAR_CLASSES


def python2_style_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """The opcodes Python 2's cPickle wrote for the original batches (str as BINSTRING, numpy.core)."""
    def string(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b

    def small(i: int) -> bytes:
        return b"K" + bytes([i]) if i < 256 else b"M" + struct.pack("<H", i)

    dtype = (b"cnumpy\ndtype\n" + string(b"u1") + small(0) + small(1) + b"\x87R"
             + b"(" + small(3) + string(b"|") + b"NNN" + (b"J" + struct.pack("<i", -1)) * 2 + small(0) + b"tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + small(0) + b"\x85"
             + string(b"b") + b"\x87R" + b"(" + small(1) + small(len(data)) + small(3072) + b"\x86"
             + dtype + b"\x89" + string(data.tobytes()) + b"tb")
    return (b"\x80\x02}(" + string(b"batch_label") + string(b"training batch 1 of 5")
            + string(b"labels") + b"](" + b"".join(small(x) for x in labels) + b"e"
            + string(b"data") + array + string(b"filenames") + b"](" + string(b"x.png") * len(data) + b"e"
            + b"u.")


def test_reads_python2_pickles_like_the_original(cifar_root, kaggle_images):
    images, labels = kaggle_images
    folder = cifar_root / "cifar-10-batches-py"
    (folder / "test_batch").write_bytes(python2_style_batch(images[:3].reshape(3, -1), labels[:3]))
    test = load_cifar10(cifar_root, "test")
    assert np.array_equal(test.inputs.numpy(), images[:3]) and test.targets.tolist() == labels[:3]


def test_reads_a_python3_protocol_2_batch(cifar_root, kaggle_images):
    images, labels = kaggle_images
    content = {b"batch_label": b"testing batch 1 of 1", b"labels": labels[:4],
               b"data": images[:4].reshape(4, -1), b"filenames": [b"a.png", b"b.png", b"c.png", b"d.png"]}
    payload = pickle.dumps(content, protocol=2)
    assert b"c_codecs\nencode\n" in payload  # what made such batches unreadable before
    (cifar_root / "cifar-10-batches-py" / "test_batch").write_bytes(payload)
    test = load_cifar10(cifar_root, "test")
    assert np.array_equal(test.inputs.numpy(), images[:4]) and test.targets.tolist() == labels[:4]


class EncodesWith:
    """Pickles as `_codecs.encode(text, codec)`, as protocol 2 does for bytes, with any codec."""

    def __init__(self, text: str, codec: str):
        self.text, self.codec = text, codec

    def __reduce__(self):
        import _codecs

        return _codecs.encode, (self.text, self.codec)


@pytest.mark.parametrize("payload,asked", [
    (EncodesWith("x", "rot13"), r"_codecs\.encode with str and codec 'rot13'"),
    (EncodesWith("x", "zlib_codec"), r"_codecs\.encode with str and codec 'zlib_codec'"),
    (__import__("codecs").decode, r"_codecs\.decode"),
    (getattr, r"__builtin__\.getattr"),  # protocol 2 writes Python 2's module name
])
def test_other_globals_and_codecs_are_still_refused(cifar_root, payload, asked):
    (cifar_root / "cifar-10-batches-py" / "test_batch").write_bytes(
        pickle.dumps({b"data": payload, b"labels": []}, protocol=2))
    with pytest.raises(UserError, match=r"refusing to load .*test_batch: it asks for " + asked):
        load_cifar10(cifar_root, "test")


def test_missing_batch_is_named(cifar_root):
    (cifar_root / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(UserError, match=r"data_batch_3 not found; pass --data DIR"):
        load_cifar10(cifar_root, "train")
    assert len(load_cifar10(cifar_root, "test")) == 50  # the test split does not need it


def test_truncated_or_foreign_batch_is_refused(cifar_root):
    batch = cifar_root / "cifar-10-batches-py" / "data_batch_2"
    batch.write_bytes(batch.read_bytes()[:5000])
    with pytest.raises(UserError, match=r"data_batch_2 is not a readable CIFAR-10 pickle"):
        load_cifar10(cifar_root, "train")
    batch.write_bytes(b"this is not a pickle at all")
    with pytest.raises(UserError, match=r"data_batch_2 is not a readable"):
        load_cifar10(cifar_root, "train")


@pytest.mark.parametrize("content,message", [
    ({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, "expected uint8"),
    ({b"data": np.zeros((2, 3072), np.float32), b"labels": [0, 1]}, "expected uint8"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "2 images but 1 labels"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, "has label 10"),
    ({b"labels": [0, 1]}, "no 'data' entry"),
])
def test_bad_batch_contents_are_refused(cifar_root, content, message):
    (cifar_root / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps(content, protocol=4))
    with pytest.raises(UserError, match=message) as info:
        load_cifar10(cifar_root, "test")
    assert "test_batch" in str(info.value)


class RunsAShellCommand:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_is_refused_without_running(cifar_root, tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({b"data": RunsAShellCommand(marker), b"labels": []}, protocol=4)
    (cifar_root / "cifar-10-batches-py" / "test_batch").write_bytes(payload)
    with pytest.raises(UserError, match=r"refusing to load .*test_batch: it asks for (posix|os)\.system"):
        load_cifar10(cifar_root, "test")
    assert not marker.exists()


# --- safe tar extraction and download ----------------------------------------------------------


def make_tar(path: Path, members: dict[str, bytes], symlink: str | None = None) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        if symlink:
            link = tarfile.TarInfo(symlink)
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            archive.addfile(link)
    return path


def test_tar_member_climbing_out_is_refused(tmp_path):
    dest = tmp_path / "dest"
    archive = make_tar(tmp_path / "evil.tar.gz", {"ok/a.txt": b"fine", "ok/../../escaped.txt": b"evil"})
    with pytest.raises(UserError, match=r"climbs out with '\.\.'"):
        safe_extract_tar(archive, dest)
    assert not (tmp_path / "escaped.txt").exists()
    assert list(dest.iterdir()) == []  # nothing half-extracted, no staging folder left


def test_tar_symlink_member_is_refused(tmp_path):
    archive = make_tar(tmp_path / "link.tar.gz", {"a.txt": b"x"}, symlink="passwd")
    with pytest.raises(UserError, match="is a symbolic link"):
        safe_extract_tar(archive, tmp_path / "dest")


def test_tar_extraction_completes_after_a_crash(tmp_path):
    dest = tmp_path / "dest"
    (dest / ".good.tar.gz.extracting" / "x").mkdir(parents=True)  # left by a killed run
    (dest / "top").mkdir()
    (dest / "top" / "a.txt").write_bytes(b"partial")  # moved in by the killed run, then rewritten
    archive = make_tar(tmp_path / "good.tar.gz", {"top/a.txt": b"aaa", "top/sub/b.txt": b"bbb"})
    safe_extract_tar(archive, dest)
    assert (dest / "top" / "a.txt").read_bytes() == b"aaa"
    assert (dest / "top" / "sub" / "b.txt").read_bytes() == b"bbb"
    assert sorted(p.name for p in dest.iterdir()) == ["top"]


def test_cifar_download_offline_says_where_to_put_the_archive(tmp_path, monkeypatch):
    def offline(url, dest, **kwargs):
        raise DownloadError(url, Path(dest), "network unreachable")

    monkeypatch.setattr(cifar10, "fetch", offline)
    with pytest.raises(UserError, match="put cifar-10-python.tar.gz at") as info:
        load_cifar10(tmp_path, "train", download=True)
    assert str(tmp_path / "cifar-10-python.tar.gz") in str(info.value)


def test_cifar_download_extracts_the_archive(tmp_path, kaggle_images, monkeypatch):
    source = write_cifar10(tmp_path / "src", *kaggle_images) / "cifar-10-batches-py"
    archive = tmp_path / "built.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="cifar-10-batches-py")
    fetched = []

    def fake_fetch(url, dest, md5=None, **kwargs):  # stands in for the network
        fetched.append((url, md5))
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(archive, dest)
        return Path(dest)

    monkeypatch.setattr(cifar10, "fetch", fake_fetch)
    root = tmp_path / "root"
    test = load_cifar10(root, "test", download=True)
    assert fetched == [(cifar10.URL, cifar10.MD5)]
    assert np.array_equal(test.inputs.numpy(), kaggle_images[0][150:])
    load_cifar10(root, "train", download=True)
    assert len(fetched) == 1  # already extracted: not fetched again
