"""The learning rate on transfer.py's task: each chosen arm at each rate, over seeds.

Every arm of transfer.py shares one setting a user's recipe must pick: `optim.lr` (SGD, batch 32 there).
This runs the chosen arms (default: every layer at one rate, the `inception_v3/imagefolder` way) at each
rate of `--lrs`, on the same task and cached backbone as transfer.py, and writes `transfer_lr`, a table of
its own on the fine-tuning page.

    python benchmarks/transfer_lr.py --pretrain-epochs 5 --classes 30 --epochs 6   # ~13 min with the backbone cached
    python benchmarks/transfer_lr.py --arms new_schedule --lrs 0.01,0.1 --seeds 5
    python benchmarks/transfer_lr.py --smoke
"""

from __future__ import annotations

import time

import transfer  # this folder's sibling module: the task, its arms and settings
from _results import write_result

DEFAULT_LRS = "0.00125,0.005,0.01,0.03,0.1"  # 0.01 is transfer.py's; 0.1 the guide's at batch 32


def main() -> None:
    parser = transfer.task_parser(__doc__.splitlines()[0], "one_rate")
    parser.add_argument("--lrs", default=DEFAULT_LRS, help=f"comma-separated learning rates (default {DEFAULT_LRS})")
    args = parser.parse_args()
    lrs = [float(value) for value in args.lrs.split(",")]
    start = time.perf_counter()
    task = transfer.prepare_task(args)
    rows = [{"lr": lr, **row} for lr in lrs
            for row in transfer.run_arms(task.arms, task.folder, task.weights,
                                         transfer.Settings(**{**task.settings.__dict__, "lr": lr}), task.work)]
    write_result("transfer_lr", rows, title=f"{task.title()}, SGD at batch {task.settings.batch} and each learning rate",
                 settings={**task.settings.__dict__, "smoke": task.smoke, "lrs": lrs},
                 columns=[("lr", "learning rate"), *transfer.COLUMNS],
                 details={"seconds": time.perf_counter() - start, "backbone": str(task.weights)})


if __name__ == "__main__":
    main()
