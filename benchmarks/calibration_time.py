"""The training calibration that a long run does on this machine, timed end to end.

`train ... train.precision=auto train.channels_last=auto train.compile=auto` decides its speed settings
before the first step: the probe rules candidates out, a timed calibration picks among the rest
(inceptionlab.hardware). A run of at least engine.speed.COMPILE_MIN_STEPS steps also gets torch.compile
where the probe allows it (NVIDIA GPUs): decided by the probe, never timed (the candidates are timed
eager, within the 20 s budget). This script makes that decision as such a run
would, on a fresh speed cache, and prints one JSON object: the decision and its evidence, the wall time
from the model's construction to the decision, and the GPU memory the process still holds after it (a
calibration that keeps its buffers takes them from the resident data that the run places next).

    python benchmarks/calibration_time.py [--device cuda] [--recipe inception_v3/tiny_imagenet] [--steps 5000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    parser.add_argument("--recipe", default="inception_v3/tiny_imagenet")
    parser.add_argument("--steps", type=int, default=None, help="the run's length in steps (default: the "
                                                                "shortest run that gets torch.compile)")
    args = parser.parse_args(argv)
    # A cache of its own: the decision is measured afresh, and the user's cache is left alone.
    os.environ["INCEPTIONLAB_CACHE"] = tempfile.mkdtemp(prefix="calibration-cache-")
    os.environ.pop("INCEPTIONLAB_AUTO", None)  # `safe` would skip the measurement this script is for

    import torch

    from inceptionlab import hardware
    from inceptionlab.engine.choices import load_training_recipe
    from inceptionlab.engine.speed import COMPILE_MIN_STEPS, RunShape, decide_training
    from inceptionlab.engine.task import make_task
    from inceptionlab.models.registry import build_model

    device = torch.device(args.device)
    steps = args.steps or COMPILE_MIN_STEPS
    started = time.perf_counter()
    recipe = load_training_recipe(args.recipe, ["model.weights=null", "train.precision=auto",
                                                "train.channels_last=auto", "train.compile=auto"])
    classes = 10 if recipe.data.reader == "digits" else 200
    built = build_model(recipe.model.name, classes, None, recipe.model.aux_loss_weight, **recipe.model.kwargs)
    task = make_task(recipe.task, classes, recipe.train.label_smoothing, recipe.model.aux_loss_weight)
    shape = RunShape((3, recipe.data.train_crop_size, recipe.data.train_crop_size), False, classes, steps=steps)
    built_s = time.perf_counter() - started
    decision = decide_training(recipe, built.model.to(device), task, device, shape, hardware.device_facts(device),
                               fresh=True, measure=True)
    seconds = time.perf_counter() - started
    held = {}
    if device.type == "cuda":
        gc.collect()
        held = {"allocated_mib": round(torch.cuda.memory_allocated(device) / 2**20),
                "reserved_mib": round(torch.cuda.memory_reserved(device) / 2**20),
                "peak_mib": round(torch.cuda.max_memory_allocated(device) / 2**20)}
    print(json.dumps({"recipe": args.recipe, "device": str(device), "steps": steps, "batch": recipe.train.batch_size,
                      "seconds": round(seconds, 1), "model_seconds": round(built_s, 1),
                      "decision": decision.to_dict(), "summary": decision.summary(), "gpu_memory_after": held}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
