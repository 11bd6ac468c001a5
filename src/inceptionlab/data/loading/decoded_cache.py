"""Decode an ImageFolder split once into a uint8 tensor file, reused until its files change.

Layout: `<dataset root>/.inceptionlab-cache/<split>-<cache_size>.pt` plus `<split>-<cache_size>.json`
(the manifest: every file's relative path, byte size and mtime). A read-only dataset folder (a shared
mount) gets its cache under `$XDG_CACHE_HOME/inceptionlab/<hash of the folder>/` instead. Both files
are written atomically; the manifest is also stored inside the .pt, so a cache is used only when the
folder's current listing equals both.

Sizes: images are kept at their decoded size when it fits in cache_size x cache_size (tiny-imagenet's
64 x 64 are exact); larger ones are shrunk, keeping their aspect ratio, to fit inside it (JPEGs are
decoded at a reduced scale first, PIL draft). The tensor is (N, 3, H_max, W_max) with each image
top-left and its true height/width beside it, so crops never see the padding. The default
cache_size 342 is the guide's eval resize: evaluation never upsamples what it had.

Unreadable files are counted and named with their reason (`unreadable`, UnreadableFile), as the worker
path reports them; a file that cannot even be stat'ed (a link whose target is gone) is listed in the
manifest without size and mtime, so the cache is rebuilt once it can.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from inceptionlab.data.io.decode import ImageReadError, UnreadableFile, load_rgb
from inceptionlab.data.loading.shared_memory import fit_workers
from inceptionlab.fileio import atomic_torch_save, atomic_write_json
from PIL import Image

CACHE_VERSION = 2  # 2: unreadable files are stored with their reason
CACHE_DIRNAME = ".inceptionlab-cache"
HEADER_SAMPLE = 32  # image headers read to estimate a split's size before it is decoded
DECODE_BATCH = 64  # files per worker task while decoding a split


@dataclass
class ImageCache:
    images: torch.Tensor  # uint8 (N, 3, H_max, W_max); image n occupies [:heights[n], :widths[n]]
    heights: torch.Tensor  # int64 (N,); 0 for an unreadable file
    widths: torch.Tensor
    targets: torch.Tensor  # int64 (N,)
    paths: list[str]
    unreadable: list[UnreadableFile]

    @property
    def readable(self) -> torch.Tensor:
        return self.heights > 0


def split_manifest(samples: list[tuple[str, int]], split_root: Path, cache_size: int) -> dict[str, Any]:
    """What the cache was built from: any added, removed, resized or touched file changes it."""
    files = []
    for path, target in samples:
        try:
            stat = os.stat(path)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:  # a broken link, or a file gone since the listing: decoding names it
            size = mtime = None
        files.append([os.path.relpath(path, split_root), target, size, mtime])
    return {"version": CACHE_VERSION, "cache_size": cache_size, "files": files}


def cache_paths(split_root: Path, cache_size: int) -> tuple[Path, Path]:
    split_root = Path(split_root).resolve()
    folder = split_root.parent / CACHE_DIRNAME
    if not os.access(split_root.parent, os.W_OK) and not folder.is_dir():
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inceptionlab"
        folder = base / hashlib.sha256(str(split_root).encode()).hexdigest()[:16]
    stem = f"{split_root.name}-{cache_size}"
    return folder / f"{stem}.pt", folder / f"{stem}.json"


def load_or_build(samples: list[tuple[str, int]], split_root: Path, cache_size: int, num_workers: int = 0,
                  build: bool = True) -> ImageCache | None:
    """The split's cache: loaded when its manifest matches the files, decoded (and saved) otherwise.

    build=False: None instead of decoding when the cache is absent or stale.
    """
    tensor_path, manifest_path = cache_paths(split_root, cache_size)
    manifest = split_manifest(samples, split_root, cache_size)
    cached = _load_if_current(tensor_path, manifest)
    if cached is not None or not build:
        return cached
    cache = decode_split(samples, cache_size, num_workers)
    payload = {"manifest": manifest, "images": cache.images, "heights": cache.heights, "widths": cache.widths,
               "targets": cache.targets, "paths": cache.paths,
               "unreadable": [[str(path), path.problem] for path in cache.unreadable]}  # plain data: weights_only loads
    atomic_torch_save(payload, tensor_path)
    atomic_write_json(manifest_path, manifest)
    return cache


def _load_if_current(tensor_path: Path, manifest: dict[str, Any]) -> ImageCache | None:
    if not tensor_path.is_file():
        return None
    try:
        payload = torch.load(tensor_path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - a damaged cache is rebuilt, never trusted
        return None
    if payload.get("manifest") != manifest:
        return None
    return ImageCache(payload["images"], payload["heights"], payload["widths"], payload["targets"],
                      payload["paths"], [UnreadableFile(path, problem) for path, problem in payload["unreadable"]])


def decode_to_fit(path: str, cache_size: int) -> torch.Tensor | UnreadableFile:
    """One file as uint8 CHW fitting inside cache_size x cache_size; its UnreadableFile (the path with the
    reason) if it cannot be decoded.

    The one decode for the resident cache and the streaming loader, so both see the same pixels.
    """
    # torchvision: ~1.3 s at import, needed only while images are decoded
    from torchvision.transforms.v2.functional import pil_to_tensor

    try:
        image = load_rgb(path, max_side=cache_size)  # JPEGs: PIL draft decodes at 1/2, 1/4 or 1/8 scale
    except ImageReadError as exc:
        return UnreadableFile.from_error(exc, path)
    if max(image.size) > cache_size:
        # PIL's bilinear resize is antialiased (a triangle filter as wide as the scale).
        factor = cache_size / max(image.size)
        size = (max(1, round(image.width * factor)), max(1, round(image.height * factor)))
        image = image.resize(size, resample=2)  # Image.Resampling.BILINEAR
    return pil_to_tensor(image)


class _DecodeFiles(Dataset):
    """Each file decoded to uint8 CHW fitting inside cache_size x cache_size, or its UnreadableFile."""

    def __init__(self, samples: list[tuple[str, int]], cache_size: int):
        self.samples, self.cache_size = samples, cache_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor | UnreadableFile:
        return decode_to_fit(self.samples[index][0], self.cache_size)


def _keep_list(batch: list[Any]) -> list[Any]:
    return batch


def decode_split(samples: list[tuple[str, int]], cache_size: int, num_workers: int = 0) -> ImageCache:
    """Decode every file (in `num_workers` processes) into one padded uint8 tensor."""
    # At most 3 x cache_size^2 bytes an image, 64 a batch, PyTorch's default prefetch of 2.
    num_workers = fit_workers(num_workers, 2, DECODE_BATCH * 3 * cache_size**2, what="image cache build")
    # Its own generator: a DataLoader otherwise draws its base seed from the global RNG, and a run that
    # builds the cache would then initialise its model differently from one that loads it.
    loader = DataLoader(_DecodeFiles(samples, cache_size), batch_size=DECODE_BATCH, num_workers=num_workers,
                        collate_fn=_keep_list, generator=torch.Generator())
    decoded: list[torch.Tensor | UnreadableFile] = [image for batch in loader for image in batch]
    pictures = [None if isinstance(x, UnreadableFile) else x for x in decoded]
    heights = torch.tensor([0 if x is None else x.shape[1] for x in pictures], dtype=torch.long)
    widths = torch.tensor([0 if x is None else x.shape[2] for x in pictures], dtype=torch.long)
    height, width = max([1, *heights.tolist()]), max([1, *widths.tolist()])
    images = torch.zeros(len(decoded), 3, height, width, dtype=torch.uint8)
    for n, image in enumerate(pictures):
        if image is not None:
            images[n, :, : image.shape[1], : image.shape[2]] = image
    paths = [path for path, _ in samples]
    unreadable = [x for x in decoded if isinstance(x, UnreadableFile)]
    targets = torch.tensor([target for _, target in samples], dtype=torch.long)
    return ImageCache(images, heights, widths, targets, paths, unreadable)


def estimated_bytes(samples: list[tuple[str, int]], split_root: Path, cache_size: int) -> int:
    """Bytes of the split's cache, from the largest of ~32 evenly spaced image headers (no decoding)."""
    if not samples:
        return 0
    step = max(1, len(samples) // HEADER_SAMPLE)
    largest_h = largest_w = 1
    for path, _ in samples[::step]:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001 - an unreadable file is counted when decoding
            continue
        factor = min(1.0, cache_size / max(width, height))
        largest_h, largest_w = max(largest_h, round(height * factor)), max(largest_w, round(width * factor))
    return len(samples) * 3 * largest_h * largest_w
