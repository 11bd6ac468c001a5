"""Run under torchrun (2 processes, gloo): who decodes an image folder's cache when every rank asks for it.

    torchrun --standalone --nproc_per_node=2 tests/helpers/ddp_cache_build.py OUT FOLDER

Both ranks build a resident training loader for FOLDER at the same moment (after a barrier). Writes
OUT/rank<R>.json: {"decoded": how many times this rank decoded the split, "pixels": the sum of the
cached pixels it serves, "images": their count}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from inceptionlab.data.datasets.imagefolder import RobustImageFolder
from inceptionlab.data.loading import decoded_cache
from inceptionlab.data.loading.image_options import DeviceImageOptions
from inceptionlab.data.loading.loaders import make_loader


def main(out: Path, folder: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    decoded = []
    original = decoded_cache.decode_split

    def counting(*args, **kwargs):
        decoded.append(1)
        return original(*args, **kwargs)

    decoded_cache.decode_split = counting
    options = DeviceImageOptions(train_size=16, val_resize_size=16, val_crop_size=16, cache_size=32)
    split = RobustImageFolder(folder / "train")
    dist.barrier()  # both ranks ask at once
    loader = make_loader(split, batch_size=4, train=True, seed=0, num_workers=0, rank=rank, world_size=world,
                         local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]), mode="resident", images=options)
    record = {"decoded": len(decoded), "pixels": int(loader.images.sum()), "images": int(loader.images.shape[0])}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
