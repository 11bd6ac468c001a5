"""Small datasets in each original file format, written by the tests themselves.

A clone of the repository tests its readers, its text path, its security checks and its serving with
these alone; the real files in ../shared/data are an extra layer on top (tests/conftest.py
`shared_data`). Every writer is deterministic (fixed seeds) and takes well under a second.

- `write_idx_dataset`: Fashion-MNIST/MNIST's four idx files (gzipped, as distributed), 10 classes
  that differ by a drawn pattern, so a small MLP learns them in one epoch;
- `write_cifar10`: the CIFAR-10 "python version" batches and batches.meta, classes by colour;
- `write_aclimdb` / `tar_folder`: reviews in aclImdb's layout, positive and negative by their words,
  with what real reviews hold (<br /> tags, punctuation, capitals, non-ASCII, some over 500 words);
- `write_tiny_imagenet`: tiny-imagenet-200's original layout (flat val/images + val_annotations.txt);
- `write_photos`: a few JPEG "photos" under the names the guide's sample folder has.
"""

from __future__ import annotations

import gzip
import struct
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from helpers.cifar_writers import write_cifar10_batch, write_cifar10_meta

FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PALETTE = [(220, 40, 40), (40, 200, 60), (50, 70, 230), (230, 220, 40), (200, 60, 220), (40, 210, 210),
           (250, 140, 30), (120, 60, 20), (140, 140, 140), (20, 20, 20)]


# --------------------------------------------------------------------------------------- idx (MNIST)


def idx_bytes(array: np.ndarray) -> bytes:
    """The idx format: magic (0, 0, type, ndim), big-endian dimensions, the data (uint8 here)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def pattern_images(labels: np.ndarray, size: int = 28, seed: int = 0) -> np.ndarray:
    """(N, size, size) uint8 greyscale: class k is a bright horizontal band at a height of its own, plus
    noise; classes a linear model separates."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 60, size=(len(labels), size, size)).astype(np.uint8)
    band = max(1, size // 10)
    for i, label in enumerate(labels):
        top = int(label) * (size - band) // 9
        images[i, top:top + band, :] = rng.integers(200, 256, size=(band, size))
    return images


def write_idx_dataset(folder: Path, train: int = 300, test: int = 100, seed: int = 0) -> Path:
    """train-/t10k- images and labels (.gz) in `folder`; labels cycle 0..9 (test image 0 is class 9,
    "Ankle boot", as in the real Fashion-MNIST test file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count, offset in (("train", train, 0), ("t10k", test, 9)):
        labels = (np.arange(count) + offset) % 10
        images = pattern_images(labels, seed=seed + (prefix == "t10k"))
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(images), mtime=0))
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(labels), mtime=0))
    return folder


# --------------------------------------------------------------------------------------- CIFAR-10


def colour_images(labels: list[int], size: int = 32, seed: int = 0) -> np.ndarray:
    """(N, 3, size, size) uint8: class k is PALETTE[k] plus noise."""
    rng = np.random.default_rng(seed)
    colours = np.array([PALETTE[label % len(PALETTE)] for label in labels], dtype=np.int64)[:, :, None, None]
    noise = rng.integers(-40, 40, size=(len(labels), 3, size, size))
    return np.clip(colours + noise, 0, 255).astype(np.uint8)


def cifar10_images(count: int = 200, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    labels = [i % 10 for i in range(count)]
    return colour_images(labels, seed=seed), labels


def write_cifar10(root: Path, images: np.ndarray | None = None, labels: list[int] | None = None) -> Path:
    """root/cifar-10-batches-py: data_batch_1..5 (30 images each) and test_batch (the rest, 50 of the
    default 200), and batches.meta; returns root."""
    if images is None or labels is None:
        images, labels = cifar10_images()
    folder = root / "cifar-10-batches-py"
    write_cifar10_meta(folder / "batches.meta", CIFAR10_CLASSES)
    for i in range(5):
        part = slice(30 * i, 30 * (i + 1))
        write_cifar10_batch(folder / f"data_batch_{i + 1}", images[part], labels[part],
                            batch_label=f"training batch {i + 1} of 5")
    write_cifar10_batch(folder / "test_batch", images[150:], labels[150:], batch_label="testing batch 1 of 1")
    return root


# --------------------------------------------------------------------------------------- IMDB

POSITIVE = ["great", "wonderful", "moving", "superb", "brilliant", "loved", "beautiful", "charming", "best"]
NEGATIVE = ["awful", "boring", "dull", "terrible", "waste", "worst", "poor", "bland", "hated"]
NEUTRAL = ["the", "film", "movie", "plot", "actor", "scene", "story", "and", "a", "of", "it", "was", "this",
           "director", "ending", "music", "camera", "script", "cast", "time", "hour", "minute", "dialogue"]
SPICE = ["<br /><br />", "Don't", "it's", "(really)", "!!", "...", "C++", "10/10", "Café", "naïve", "“quoted”",
         "—", "ÉCOLE", "¿qué?", "<br />", "$5", "100%", "[sic]", "well-made", "so-so"]


def review(rng: np.random.Generator, positive: bool, words: int) -> str:
    mood = POSITIVE if positive else NEGATIVE
    picks = []
    for _ in range(words):
        roll = rng.random()
        pool = mood if roll < 0.25 else SPICE if roll < 0.35 else NEUTRAL
        word = str(pool[rng.integers(len(pool))])
        picks.append(word.capitalize() if rng.random() < 0.1 else word)
    return " ".join(picks) + "."


def write_aclimdb(root: Path, per_label: int = 24, seed: int = 0) -> Path:
    """root/aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt (`per_label` reviews each), plus what a real
    aclImdb holds beside them and the reader must skip (train/unsup, urls_*.txt, imdb.vocab, README).
    Every fifth review runs past 500 words (longer than the guide's 250-token sequences)."""
    rng = np.random.default_rng(seed)
    base = root / "aclImdb"
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            folder = base / split / label
            folder.mkdir(parents=True)
            for i in range(per_label):
                rating = int(rng.integers(7, 11)) if label == "pos" else int(rng.integers(1, 5))
                length = 520 + int(rng.integers(0, 80)) if i % 5 == 4 else 12 + int(rng.integers(0, 60))
                (folder / f"{i}_{rating}.txt").write_text(review(rng, label == "pos", length), encoding="utf-8")
            (base / split / f"urls_{label}.txt").write_text("http://www.imdb.com/title/tt0000001/usercomments\n")
    (base / "train" / "unsup").mkdir()
    (base / "train" / "unsup" / "0_0.txt").write_text("an unlabelled review the reader never reads")
    (base / "imdb.vocab").write_text("\n".join(NEUTRAL + POSITIVE + NEGATIVE) + "\n")
    (base / "README").write_text("Large Movie Review Dataset (a miniature written by the tests)\n")
    return root


def tar_folder(folder: Path, archive: Path) -> Path:
    """`folder` as a .tar.gz holding one top folder of its name (as aclImdb_v1.tar.gz does)."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return archive


# --------------------------------------------------------------------------------------- tiny-imagenet

TINY_WORDS = {
    "n00001740": "entity",
    "n01443537": "goldfish, Carassius auratus",
    "n01629819": "European fire salamander, Salamandra salamandra",
    "n01641577": "bullfrog, Rana catesbeiana",
}
TINY_WNIDS = ["n01443537", "n01629819", "n01641577"]


def jpeg_of(pixels: np.ndarray) -> bytes:
    from io import BytesIO

    buffer = BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def write_tiny_imagenet(root: Path, train_per_class: int = 8, val_per_class: int = 4, test_images: int = 2,
                        size: int = 64, seed: int = 0) -> Path:
    """root/tiny-imagenet-200 in the ORIGINAL layout (train/<wnid>/images + boxes, flat val/images with
    val_annotations.txt, test/images, wnids.txt, words.txt); classes by colour. Returns the dataset folder."""
    rng = np.random.default_rng(seed)
    dataset = root / "tiny-imagenet-200"

    def image(label: int) -> bytes:
        noise = rng.integers(-40, 40, size=(size, size, 3))
        return jpeg_of(np.clip(np.array(PALETTE[label]) + noise, 0, 255).astype(np.uint8))

    (dataset / "val" / "images").mkdir(parents=True)
    (dataset / "test" / "images").mkdir(parents=True)
    (dataset / "wnids.txt").write_text("".join(f"{w}\n" for w in TINY_WNIDS))
    (dataset / "words.txt").write_text("\n".join(f"{w}\t{words}" for w, words in TINY_WORDS.items()) + "\n")
    for label, wnid in enumerate(TINY_WNIDS):
        images = dataset / "train" / wnid / "images"
        images.mkdir(parents=True)
        boxes = []
        for k in range(train_per_class):
            (images / f"{wnid}_{k}.JPEG").write_bytes(image(label))
            boxes.append(f"{wnid}_{k}.JPEG\t0\t0\t{size - 1}\t{size - 1}\n")
        (dataset / "train" / wnid / f"{wnid}_boxes.txt").write_text("".join(boxes))
    lines = []
    for i in range(val_per_class * len(TINY_WNIDS)):
        label = i % len(TINY_WNIDS)
        (dataset / "val" / "images" / f"val_{i}.JPEG").write_bytes(image(label))
        lines.append(f"val_{i}.JPEG\t{TINY_WNIDS[label]}\t0\t0\t{size - 1}\t{size - 1}\n")
    (dataset / "val" / "val_annotations.txt").write_text("".join(lines))
    for i in range(test_images):
        (dataset / "test" / "images" / f"test_{i}.JPEG").write_bytes(image(i % len(TINY_WNIDS)))
    return dataset


# --------------------------------------------------------------------------------------- photos

PHOTO_NAMES = ("dog.jpg", "cat.jpg", "eagle.jpg")


def write_photos(folder: Path, names: tuple[str, ...] = PHOTO_NAMES, seed: int = 0) -> Path:
    """A few camera-sized JPEGs (smooth gradients and noise, 480 x 360 and 360 x 480) under the names
    of the guide's sample photos: for the paths that resize, crop and batch real photos."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        height, width = (360, 480) if i % 2 == 0 else (480, 360)
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], axis=-1)
        noise = rng.integers(-20, 20, size=(height, width, 3))
        (folder / name).write_bytes(jpeg_of(np.clip(base + noise, 0, 255).astype(np.uint8)))
    return folder
