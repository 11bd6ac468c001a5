"""Two processes under torchrun on the CPU (gloo): DDP training, unpadded evaluation, rank-0 files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_image_folder

from inceptionlab.judge.evaluate import evaluate_run

SMALL = ["model.name=resnet18", "model.weights=null", "finetune.body_lr_mult=1", "data.train_crop_size=40", "data.val_resize_size=40",
         "data.val_crop_size=40", "data.num_workers=0", "train.batch_size=4", "train.epochs=2", "optim.lr=0.01"]


def torchrun_two_ranks(*args: str, timeout: int) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run` with two local ranks on one thread each; asserts it exited 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def rank_records(out: Path) -> list[dict]:
    """What each rank's helper wrote to OUT/rank{0,1}.json."""
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_two_process_ddp_training_counts_every_val_image_once(tmp_path):
    data = make_image_folder(tmp_path / "data", train_per_class=5, val_per_class=3)
    (data / "val" / "fox" / "fox_2.png").unlink()  # 8 val images... make it odd:
    (data / "val" / "dog" / "dog_2.png").unlink()  # 7 val images: 4 + 3 across two ranks, no padding
    out = tmp_path / "runs"
    sets = [x for item in SMALL for x in ("--set", item)]
    proc = torchrun_two_ranks("-m", "inceptionlab", "train", "inception_v3/imagefolder", "--data", data, "--out", out,
                              "--no-progress", "--json", *sets, timeout=240)

    runs = list(out.glob("inception_v3/imagefolder/*"))
    assert len(runs) == 1, "only rank 0 creates a run directory"
    json_lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(json_lines) == 1, "only rank 0 prints the summary"
    rows = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    assert all(r["val_samples"] == 7 for r in rows), "padded val shards would count 8"
    assert all(r["samples"] == 16 for r in rows)  # 15 train images padded to 2 x 8

    # The all-reduced DDP metrics equal a single-process evaluation of the saved model.
    single = evaluate_run(runs[0], None, None, device=__import__("torch").device("cpu"), batch_size=3, num_workers=0)
    assert single.result["samples"] == 7
    assert single.result["loss"] == pytest.approx(rows[-1]["val_loss"], rel=1e-4, abs=1e-5)
    assert single.result["top1"] == pytest.approx(rows[-1]["val_top1"])


HELPER = Path(__file__).parent / "helpers" / "ddp_rng_record.py"
FINETUNE_HELPER = Path(__file__).parent / "helpers" / "ddp_finetune_record.py"


@pytest.mark.slow  # two processes, resnet18, three stages: ~50 s on 2 idle cores
def test_fine_tuning_stages_under_ddp_keep_the_ranks_identical(tmp_path):
    """Head on cached features, then the whole model (a DDP wrapper per stage), with EMA, a balanced
    sampler, class weights and accumulation: both ranks end with the same weights and the same average,
    and rank 0's model.pt is that average. One rank extracts the features, the other loads its file, and
    no rank waits in a collective meanwhile: rank 0 extracted while the others sat in a barrier, under
    NCCL's 10-minute default, which an ImageNet-size split outlasts."""
    from test_finetune import start_weights

    images = make_image_folder(tmp_path / "images", train_per_class=5, val_per_class=2)
    out = tmp_path / "out"
    out.mkdir()
    weights, _ = start_weights(tmp_path, "resnet18")  # a frozen body comes from weights (a random one is not frozen)
    proc = torchrun_two_ranks(FINETUNE_HELPER, out, images, weights, timeout=400)
    ranks = rank_records(out)
    assert ranks[0]["status"] == ranks[1]["status"] == "completed", proc.stdout[-1500:]
    assert ranks[0]["model"] == ranks[1]["model"] and ranks[0]["ema"] == ranks[1]["ema"]
    assert sorted(rank["extracted"] for rank in ranks) == [0, 2]  # train and val, by one rank
    assert [rank["barriers"] for rank in ranks] == [0, 0]
    assert "the whole model trains from here" in proc.stdout and "features:" in proc.stdout
    run = Path(ranks[0]["run_dir"])
    assert json.loads((run / "summary.json").read_text())["model_epoch"] == 3  # the last epoch's, not the start's
    saved = torch.load(run / "model.pt", weights_only=True)
    import hashlib

    h = hashlib.sha256()
    for key, value in sorted(saved.items()):
        h.update(key.encode())
        h.update(value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    assert h.hexdigest() == ranks[0]["ema"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3] and rows[1]["lr_body"] == 0.0 and rows[3]["lr_body"] > 0


@pytest.mark.slow  # two processes train 6 short runs: ~1 min on 2 cores
def test_after_a_resume_each_rank_draws_its_own_numbers_as_in_an_uninterrupted_run(tmp_path, imdb_root):
    """Dropout masks (IMDB's text model) and host-side random crops and flips (image folders): under
    DDP each rank draws from streams of its own, and a run stopped mid-epoch and resumed draws on every
    rank exactly what the same run draws straight through. Restoring rank 0's RNG state on every rank
    (only rank 0 writes the checkpoint) made all ranks draw the same masks and crops after a resume."""
    images = make_image_folder(tmp_path / "images")
    out = tmp_path / "out"
    torchrun_two_ranks(HELPER, out, images, imdb_root, timeout=600)
    ranks = rank_records(out)
    for recipe, kinds in (("images", {"rng", "input"}), ("text", {"rng", "input", "mask"})):
        for rank in ranks:
            runs = rank[recipe]
            assert {kind for kind, _ in runs["straight"]} == kinds
            assert runs["stopped"] and runs["resumed"], "the stop must fall mid-run"
            assert runs["stopped"] + runs["resumed"] == runs["straight"], f"{recipe}: resumed differently"
        for run in ("straight", "resumed"):
            zero, one = ranks[0][recipe][run], ranks[1][recipe][run]
            assert len(zero) == len(one)
            random_draws = [(a, b) for (kind, a), (_, b) in zip(zero, one) if kind != "input"]
            assert random_draws and all(a != b for a, b in random_draws), f"{recipe} {run}: ranks drew alike"


class RandomPerSample(torch.utils.data.Dataset):
    """Each sample is a number drawn in the worker process from the worker's own RNG (as a random
    augmentation draws it)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):
        return torch.rand(1), index


def test_each_ranks_loader_workers_draw_their_own_random_numbers():
    from inceptionlab.data.loading.sampler import EpochSampler
    from inceptionlab.data.loading.workers import worker_loader

    drawn = []
    for rank in (0, 1):
        sampler = EpochSampler(16, shuffle=True, seed=0, rank=rank, world_size=2)
        loader = worker_loader(RandomPerSample(), sampler, batch_size=4, seed=0, num_workers=1)
        loader.set_epoch(0)
        drawn.append(torch.cat([inputs for inputs, _ in loader]).flatten().tolist())
    assert len(drawn[0]) == len(drawn[1]) == 8
    assert all(a != b for a, b in zip(*drawn)), "the ranks' workers drew the same numbers"


CACHE_HELPER = Path(__file__).parent / "helpers" / "ddp_cache_build.py"


def test_one_rank_decodes_the_image_cache_and_the_other_waits_and_loads_it(tmp_path):
    """Under torchrun every rank decoded the whole split and wrote the same cache file."""
    data = make_image_folder(tmp_path / "data", train_per_class=40, val_per_class=1, size=32)
    out = tmp_path / "out"
    out.mkdir()
    torchrun_two_ranks(CACHE_HELPER, out, data, timeout=240)
    ranks = rank_records(out)
    assert sorted(rank["decoded"] for rank in ranks) == [0, 1]
    assert ranks[0]["images"] == ranks[1]["images"] == 120 and ranks[0]["pixels"] == ranks[1]["pixels"]


def test_host_memory_and_shared_memory_budgets_are_shared_by_the_local_ranks(monkeypatch):
    from inceptionlab.data.loading import resident
    from inceptionlab.data.loading.shared_memory import fit_workers

    monkeypatch.setattr(resident, "available_host_bytes", lambda: 4_000)
    cpu = torch.device("cpu")
    assert resident.placement(900, cpu) == cpu  # a quarter of 4,000 bytes
    assert resident.placement(900, cpu, sharers=2) is None  # two processes on the node: an eighth each
    assert resident.placement(400, cpu, sharers=2) == cpu
    space = lambda: (10_000, 10_000)  # noqa: E731
    assert fit_workers(4, 2, 1_000, what="test", space=space) == 4  # 9 batches of 1,000 bytes fit
    assert fit_workers(4, 2, 1_000, what="test", space=space, sharers=2) == 2  # in 5,000 bytes: 5 batches


NONFINITE_HELPER = Path(__file__).parent / "helpers" / "ddp_nonfinite.py"


def test_a_nan_on_one_rank_stops_every_rank_with_the_same_message(tmp_path):
    """Rank 1's loss turns NaN, rank 0's does not: both stop at the same log point with one message
    (raised on rank 1 alone, rank 0 waited in its next collective until the process group's timeout)."""
    torchrun_two_ranks(NONFINITE_HELPER, tmp_path, timeout=180)
    zero, one = ((tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1))
    assert zero == one == "loss is nan at step 8 on rank 1"


WEIGHTED_STEP_HELPER = Path(__file__).parent / "helpers" / "ddp_weighted_step.py"


@pytest.mark.slow  # torchrun, a training session built on each rank
def test_a_ddp_step_with_class_weights_is_the_whole_batchs_step(tmp_path):
    """Two ranks with their halves of a skewed batch, accumulating micro-batches of 2, class weights
    [1, 10, 1]: the update is one process's step on the whole batch (its weighted mean loss). With each
    rank dividing by its own sum of weights (60 and 24) DDP's average of the gradients was not that."""
    from helpers.ddp_weighted_step import CLASS_WEIGHTS, the_batch
    from torch.nn import functional as F

    from inceptionlab.models.small import cifar10_cnn

    images = make_image_folder(tmp_path / "images", train_per_class=4, val_per_class=1, size=32)
    out = tmp_path / "out"
    out.mkdir()
    torchrun_two_ranks(WEIGHTED_STEP_HELPER, out, images, timeout=240)
    zero, one = (torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in (0, 1))
    assert all(torch.equal(zero["after"][key], one["after"][key]) for key in zero["after"])
    model = cifar10_cnn(num_classes=3)
    model.load_state_dict(zero["before"])
    inputs, targets = the_batch()
    weights = torch.tensor(CLASS_WEIGHTS)
    F.cross_entropy(model(inputs), targets, weight=weights, label_smoothing=0.1).backward()  # torch's weighted mean
    for name, param in model.named_parameters():
        expected = zero["before"][name] - zero["lr"][name] * param.grad
        torch.testing.assert_close(zero["after"][name], expected, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")
