"""Decode an ImageFolder split once into a uint8 tensor file, reused until its files change.

Layout: `<dataset root>/.inceptionlab-cache/<split>-<cache_size>-<interpolation>.pt` plus a `.json`
of the same name (the manifest: every file's relative path, byte size and mtime). A read-only dataset
folder (a shared mount) gets its cache under `$XDG_CACHE_HOME/inceptionlab/<hash of the folder>/`
instead. Both files are written atomically; the manifest is also stored inside the .pt, so a cache is
used only when the folder's current listing equals both. Processes that want the same cache at once
(the ranks of a torchrun node) take turns on a lock file beside it: the first decodes and saves, the
others wait and load what it saved.

Sizes (`kept_size`): an image whose shorter side is at most cache_size is kept as decoded (tiny-imagenet's
64 x 64 exactly); a larger one is resized, with the recipe's interpolation, so that its shorter side is
cache_size, by torchvision's `Resize(cache_size)` on the uint8 tensor: with cache_size = the eval resize
(the default), the cached image is exactly what `evaluate` resizes the file to, so validation crops it
and never upsamples. The longer side is kept up to MAX_ASPECT x cache_size (a 4000 x 3000 photo: 456 x 342;
panoramas beyond 2:1 are shrunk further). JPEGs are decoded at a reduced scale first (PIL draft, as
`evaluate`, `predict` and `serve` do). Portrait images are stored turned on their side, so every stored
image is landscape and a folder of both orientations pads to 342 x 456, not 456 x 456; the loaders put
them upright per batch (`device.upright`). The tensor is (N, 3, H_max, W_max) with each image top-left and
its upright height/width beside it, so crops never see the padding.

Unreadable files are counted and named with their reason (`unreadable`, UnreadableFile), as the worker
path reports them; a file that cannot even be stat'ed (a link whose target is gone) is listed in the
manifest without size and mtime, so the cache is rebuilt once it can.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from inceptionlab.data.io.decode import ImageReadError, UnreadableFile, load_rgb, open_image
from inceptionlab.data.loading.shared_memory import fit_workers
from inceptionlab.data.transforms.device import stored
from inceptionlab.fileio import atomic_torch_save, atomic_write_json

CACHE_VERSION = 3  # 2: the shorter side kept at cache_size (1 fitted the longer side), portraits stored turned;
# 3: unreadable files stored with their reason
CACHE_DIRNAME = ".inceptionlab-cache"
# The longer side is kept up to twice cache_size: 3:2 and 16:9 photos keep their shorter side at the
# eval resize; only panoramas beyond 2:1 (rare, and each one widens every image's padding) are shrunk further.
MAX_ASPECT = 2
HEADER_SAMPLE = 32  # image headers read to estimate a split's size before it is decoded
DECODE_BATCH = 64  # files per worker task while decoding a split


@dataclass
class ImageCache:
    # uint8 (N, 3, H_max, W_max); image n occupies [:heights[n], :widths[n]], or [:widths[n], :heights[n]]
    # for a portrait (heights[n] > widths[n]), which is stored turned on its side
    images: torch.Tensor
    heights: torch.Tensor  # int64 (N,), upright; 0 for an unreadable file
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


def cache_paths(split_root: Path, cache_size: int, interpolation: str = "bilinear") -> tuple[Path, Path]:
    split_root = Path(split_root).resolve()
    folder = split_root.parent / CACHE_DIRNAME
    if not os.access(split_root.parent, os.W_OK) and not folder.is_dir():
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inceptionlab"
        folder = base / hashlib.sha256(str(split_root).encode()).hexdigest()[:16]
    stem = f"{split_root.name}-{cache_size}-{interpolation}"
    return folder / f"{stem}.pt", folder / f"{stem}.json"


def load_or_build(samples: list[tuple[str, int]], split_root: Path, cache_size: int, num_workers: int = 0,
                  build: bool = True, interpolation: str = "bilinear") -> ImageCache | None:
    """The split's cache: loaded when its manifest matches the files, decoded (and saved) otherwise.

    build=False: None instead of decoding when the cache is absent or stale. Under a lock beside the
    cache: of the processes that ask at once, one decodes, the others wait for it and load its file.
    """
    tensor_path, manifest_path = cache_paths(split_root, cache_size, interpolation)
    manifest = {**split_manifest(samples, split_root, cache_size), "interpolation": interpolation}
    with one_at_a_time(tensor_path):
        cached = _load_if_current(tensor_path, manifest)
        if cached is not None or not build:
            return cached
        cache = decode_split(samples, cache_size, num_workers, interpolation)
        payload = {"manifest": manifest, "images": cache.images, "heights": cache.heights, "widths": cache.widths,
                   "targets": cache.targets, "paths": cache.paths,
                   "unreadable": [[str(path), path.problem] for path in cache.unreadable]}  # plain data: weights_only
        atomic_torch_save(payload, tensor_path)
        atomic_write_json(manifest_path, manifest)
        return cache


@contextmanager
def one_at_a_time(tensor_path: Path) -> Iterator[None]:
    """An exclusive lock on `<cache>.lock` for the block (the OS drops it if the holder dies); no lock
    where the folder cannot hold one: each process then builds the file for itself. The ranks of a
    torchrun node that want one cache wait here, not in a collective with a timeout (NCCL's: 10 min):
    the first builds and saves, the others load (engine/features.py uses it too)."""
    try:
        tensor_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(tensor_path.with_suffix(".lock"), "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


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


def kept_size(width: int, height: int, cache_size: int) -> tuple[int, int]:
    """(width, height) an image of that size is cached at: its shorter side at most cache_size, by
    torchvision's Resize(cache_size) rule (the longer side int(cache_size x long / short)), the longer
    at most MAX_ASPECT x cache_size; images within both are kept as they are (never upsampled)."""
    short, long_ = min(width, height), max(width, height)
    longest = MAX_ASPECT * cache_size
    if short <= cache_size and long_ <= longest:
        return width, height
    if long_ <= MAX_ASPECT * short:
        new_short, new_long = cache_size, int(cache_size * long_ / short)
    else:  # a panorama: the longer side decides
        new_short, new_long = max(1, round(short * longest / long_)), longest
    return (new_long, new_short) if width >= height else (new_short, new_long)


def decode_to_fit(path: str, cache_size: int, interpolation: str = "bilinear") -> torch.Tensor | UnreadableFile:
    """One file as upright uint8 CHW of `kept_size`; its UnreadableFile (the path with the reason) if it
    cannot be decoded.

    The one decode for the resident cache and the streaming loader, so both see the same pixels; and
    with cache_size = the eval resize, the very pixels `evaluate` resizes the file to (`ModelSpec.
    eval_transform`: the same draft, then torchvision's Resize on the uint8 tensor with the same filter).
    """
    # torchvision: ~1.3 s at import, needed only while images are decoded
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2.functional import pil_to_tensor, resize

    try:
        image = pil_to_tensor(load_rgb(path, max_side=cache_size))  # JPEGs: PIL draft decodes at 1/2, 1/4 or 1/8 scale
    except ImageReadError as exc:
        return UnreadableFile.from_error(exc, path)
    height, width = image.shape[1:]
    new_width, new_height = kept_size(width, height, cache_size)
    if (new_height, new_width) != (height, width):
        image = resize(image, [new_height, new_width], interpolation=InterpolationMode(interpolation), antialias=True)
    return image


class _DecodeFiles(Dataset):
    """Each file decoded to upright uint8 CHW of `kept_size`, or its UnreadableFile (the path, with why)."""

    def __init__(self, samples: list[tuple[str, int]], cache_size: int, interpolation: str = "bilinear"):
        self.samples, self.cache_size, self.interpolation = samples, cache_size, interpolation

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor | UnreadableFile:
        return decode_to_fit(self.samples[index][0], self.cache_size, self.interpolation)


def _keep_list(batch: list[Any]) -> list[Any]:
    return batch


def decode_split(samples: list[tuple[str, int]], cache_size: int, num_workers: int = 0,
                 interpolation: str = "bilinear") -> ImageCache:
    """Decode every file (in `num_workers` processes) into one padded uint8 tensor, portraits turned."""
    # At most 3 x cache_size x MAX_ASPECT x cache_size bytes an image, 64 a batch, PyTorch's default prefetch of 2.
    num_workers = fit_workers(num_workers, 2, DECODE_BATCH * 3 * MAX_ASPECT * cache_size**2, what="image cache build")
    # Its own generator: a DataLoader otherwise draws its base seed from the global RNG, and a run that
    # builds the cache would then initialise its model differently from one that loads it.
    loader = DataLoader(_DecodeFiles(samples, cache_size, interpolation), batch_size=DECODE_BATCH,
                        num_workers=num_workers, collate_fn=_keep_list, generator=torch.Generator())
    decoded: list[torch.Tensor | UnreadableFile] = [image for batch in loader for image in batch]
    pictures = [None if isinstance(x, UnreadableFile) else x for x in decoded]
    heights = torch.tensor([0 if x is None else x.shape[1] for x in pictures], dtype=torch.long)
    widths = torch.tensor([0 if x is None else x.shape[2] for x in pictures], dtype=torch.long)
    height = max([1, *torch.minimum(heights, widths).tolist()])
    width = max([1, *torch.maximum(heights, widths).tolist()])
    images = torch.zeros(len(decoded), 3, height, width, dtype=torch.uint8)
    for n, image in enumerate(pictures):
        if image is not None:
            image = stored(image)
            images[n, :, : image.shape[1], : image.shape[2]] = image
    paths = [path for path, _ in samples]
    unreadable = [x for x in decoded if isinstance(x, UnreadableFile)]
    targets = torch.tensor([target for _, target in samples], dtype=torch.long)
    return ImageCache(images, heights, widths, targets, paths, unreadable)


def estimated_bytes(samples: list[tuple[str, int]], split_root: Path, cache_size: int) -> int:
    """Bytes of the split's cache, from the largest of ~32 evenly spaced image headers (no decoding)."""
    short, long_ = stored_canvas(samples, cache_size)
    return len(samples) * 3 * short * long_


def stored_canvas(samples: list[tuple[str, int]], cache_size: int) -> tuple[int, int]:
    """(height, width) of the padded tensor the split's images are stored in (portraits turned), estimated
    from the largest of ~32 evenly spaced image headers (no decoding)."""
    if not samples:
        return 0, 0
    step = max(1, len(samples) // HEADER_SAMPLE)
    largest_short = largest_long = 1
    for path, _ in samples[::step]:
        try:
            with open(path, "rb") as handle, open_image(handle, Path(path)) as image:  # as load_rgb opens it
                width, height = kept_size(*image.size, cache_size)
        except Exception:  # noqa: BLE001 - an unreadable file is counted when decoding
            continue
        largest_short, largest_long = max(largest_short, min(width, height)), max(largest_long, max(width, height))
    return largest_short, largest_long
