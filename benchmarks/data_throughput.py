"""Images/s delivered as normalised 299 px training batches: the guide's pipeline vs this package's.

Rows, measured in one run on the real tiny-imagenet files (copied to a temp dir, val regrouped by
the package's own `prepare_tiny_imagenet`, read by the `tiny_imagenet` reader):
- guide: ImageFolder + PIL, per-image RandomResizedCrop(299) + ToTensor + Normalize in `--workers`
  DataLoader processes, float32 batches (the guide's pipeline, 16 workers there);
- workers: `data.loader=workers`: the same crop in workers but uint8 batches, normalised (in the
  dtype `auto` trains in here, channels_last) once per batch in the main process;
- resident: `data.loader=resident`: decoded once into a uint8 cache, crop + flip + normalise per
  batch on the device: a batched matmul along the width, then each output row as the weighted sum
  of its two source rows (bf16 where the device has bf16 units, else fp32; `auto`'s layout). The
  one-off cache build is reported apart;
- stream: `data.loader=stream` (for folders too big to cache): decoded in `--workers` processes into
  uint8 batches padded to their largest image, then the resident path's crop + flip + normalise on
  the device.

`--photos N` measures the same rows on N photo-sized JPEGs written for the run (1024 x 768 and
768 x 1024, half each, classes by colour) read by the `imagefolder` reader: the cache keeps them at
456 x 342 (the shorter side at Inception's eval resize 342, portraits turned), so the resident and
stream rows resample 342 x 456 sources instead of 64 x 64 ones.

Each row: `--warmup` batches (worker start-up), then `--batches` timed batches, device synchronised.
The guide's row runs on the C library's default heap, as its script would; the package's rows run with
freed blocks kept for reuse, as `inceptionlab train` does (`host.keep_freed_memory`).

    python benchmarks/data_throughput.py [--data /work/shared/data/tiny-imagenet-200] [--batch 64]
        [--batches 20] [--workers 2] [--photos N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from _results import write_result  # this folder's sibling module
from inceptionlab.config import load_recipe
from inceptionlab.data.datasets.tiny_imagenet import prepare_tiny_imagenet
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import make_loader
from inceptionlab.data.readers import read_splits
from inceptionlab.host import keep_freed_memory
from inceptionlab.models.spec import Normalize

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def copy_dataset(source: Path, into: Path) -> Path:
    """The original layout copied beside us, val regrouped there by the package (the source stays read-only)."""
    target = into / "tiny-imagenet-200"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("test"))
    prepare_tiny_imagenet(into, progress=False)
    return target


def write_photos(into: Path, count: int) -> Path:
    """`count` JPEGs of 1024 x 768 and 768 x 1024 in two class folders of train/ (and one val image each)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    root = into / "photos"
    for split, number in (("train", count), ("val", 2)):
        for n in range(number):
            name = ("sea", "sand")[n % 2]
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            size = (768, 1024) if n % 4 < 2 else (1024, 768)  # (height, width): both orientations
            pixels = rng.integers(0, 60, (*size, 3), dtype=np.uint8) + np.uint8(150 if name == "sea" else 40)
            Image.fromarray(pixels).save(folder / f"{n}.jpg", quality=90)
    return root


def cpu_seconds() -> float:
    """CPU time of this process plus its reaped children (DataLoader workers, once joined)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(make_batches: Callable[[], Iterable], warmup: int, count: int, finish) -> dict[str, float]:
    """img/s over `count` batches after `warmup`; CPU time per image over all of them, workers included.

    On a shared machine wall-clock img/s depends on how many processes each pipeline runs (more
    processes, larger share of the cores); CPU time per image does not.
    """
    batches = make_batches()  # listing files, loading the cache: set-up, not counted
    cpu_start = cpu_seconds()
    iterator = iter(batches)
    start = time.perf_counter()
    for _ in range(warmup):
        finish(next(iterator)[0])
    first = time.perf_counter() - start
    images = 0
    start = time.perf_counter()
    for _ in range(count):
        images += len(finish(next(iterator)[0]))
    seconds = time.perf_counter() - start
    del iterator, batches
    gc.collect()  # shuts the worker processes down and reaps them, so their CPU time is counted
    cpu = cpu_seconds() - cpu_start
    total = images * (warmup + count) / count
    return {"images_per_s": images / seconds, "images": images, "seconds": seconds, "warmup_seconds": first,
            "cpu_ms_per_image": 1000 * cpu / total}


def guide_batches(train_dir: Path, batch: int, workers: int) -> Iterable:
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomResizedCrop(299), transforms.ToTensor(),
                                    transforms.Normalize(MEAN, STD)])
    dataset = datasets.ImageFolder(str(train_dir), transform=transform)
    return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers,
                                       persistent_workers=workers > 0)


def package_loader(root: Path, mode: str, batch: int, workers: int, device: torch.device,
                   cache_size: int = 342) -> Any:
    reader = "tiny_imagenet" if root.name == "tiny-imagenet-200" else "imagefolder"
    recipe = load_recipe("inception_v3/tiny_imagenet", [f"data.root={root}", f"data.loader={mode}",
                                                        f"data.reader={reader}",
                                                        f"data.num_workers={workers}", "train.precision=auto",
                                                        "train.channels_last=auto", f"train.batch_size={batch}",
                                                        f"data.cache_size={cache_size}"])
    splits = read_splits(recipe.data)
    loader = make_loader(splits.train, batch_size=batch, train=True, seed=0, num_workers=workers, device=device,
                         mode=mode, images=DeviceImageOptions.from_recipe(recipe, device))
    loader.set_epoch(0)
    return loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/tiny-imagenet-200"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--photos", type=int, default=0, help="measure on this many photo-sized JPEGs instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    normalize = Normalize(MEAN, STD, channels_last=True).to(device)

    def delivered(x: torch.Tensor) -> torch.Tensor:  # what the model receives, on the device
        sync()
        return x

    # The dtype `auto` trains in here: bf16 only where the device has bf16 units (inceptionlab.hardware's probe).
    dtype = DeviceImageOptions.from_recipe(load_recipe("inception_v3/tiny_imagenet", ["train.precision=auto"]),
                                           device).dtype

    def normalised(x: torch.Tensor) -> torch.Tensor:
        return delivered(normalize(x.to(device, non_blocking=True)).to(dtype))

    needed = (args.warmup + args.batches) * args.batch
    if args.photos and args.photos < needed:  # each row reads one epoch: it would run out of batches
        raise SystemExit(f"--photos {args.photos}: give at least {needed} ((--warmup {args.warmup} + --batches "
                         f"{args.batches}) x --batch {args.batch}), or fewer --batches")
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = write_photos(Path(tmp), args.photos) if args.photos else copy_dataset(args.data, Path(tmp))
        rows["guide"] = timed(lambda: guide_batches(root / "train", args.batch, args.workers), args.warmup,
                              args.batches, lambda x: delivered(x.to(device)))
        # The guide's script runs on the C library's default heap; `inceptionlab` keeps freed blocks
        # for reuse from its start (host.keep_freed_memory), so the package's rows run as it does.
        heap = keep_freed_memory()
        rows["workers"] = timed(lambda: package_loader(root, "workers", args.batch, args.workers, device),
                                args.warmup, args.batches, normalised)
        start = time.perf_counter()
        package_loader(root, "resident", args.batch, args.workers, device)  # builds the cache once
        cache_seconds = time.perf_counter() - start
        rows["resident"] = timed(lambda: package_loader(root, "resident", args.batch, args.workers, device),
                                 args.warmup, args.batches, delivered)
        rows["resident"]["cache_build_seconds"] = cache_seconds
        rows["stream"] = timed(lambda: package_loader(root, "stream", args.batch, args.workers, device),
                               args.warmup, args.batches, delivered)
        if not args.photos:
            # The same path with data.cache_size=64 (tiny-imagenet's own size): the row the earlier
            # fixed-size batches (cache_size^2 of padding) needed; with batches padded to their images it
            # should equal the row above.
            rows["stream@64"] = timed(lambda: package_loader(root, "stream", args.batch, args.workers, device, 64),
                                      args.warmup, args.batches, delivered)
    guide = rows["guide"]["images_per_s"]
    for name, row in rows.items():
        row["pipeline"] = name
        row["vs_guide"] = row["images_per_s"] / guide
        row["cpu_vs_guide"] = rows["guide"]["cpu_ms_per_image"] / row["cpu_ms_per_image"]
    source = (f"{args.photos} photo-sized JPEGs (1024 x 768, both orientations)" if args.photos
              else "64 px tiny-imagenet images")
    write_result("data_throughput" + ("_photos" if args.photos else ""), list(rows.values()), device=str(device),
                 settings={**{k: str(v) for k, v in vars(args).items()}, "package_heap": heap},
                 title=f"Normalised 299 px training batches of {args.batch} from {source}, "
                       f"{args.workers} DataLoader workers",
                 columns=[("pipeline", "pipeline"), ("images_per_s", "img/s", ".1f"), ("vs_guide", "vs the guide's", ".2f"),
                          ("cpu_ms_per_image", "CPU ms per image", ".2f"),
                          ("cache_build_seconds", "cache build s (once)", ".1f")])
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return
    print(f"{'pipeline':<10} {'img/s':>8} {'vs guide':>9} {'CPU ms/img':>11} {'img per CPU-s vs guide':>23}  notes")
    for name, row in rows.items():
        note = f"cache built in {row['cache_build_seconds']:.1f} s (once)" if "cache_build_seconds" in row else ""
        print(f"{name:<10} {row['images_per_s']:>8.1f} {row['vs_guide']:>8.2f}x {row['cpu_ms_per_image']:>11.2f} "
              f"{row['cpu_vs_guide']:>22.2f}x  {note}")


if __name__ == "__main__":
    main()
