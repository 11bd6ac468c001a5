"""A full disk is the user's problem to fix, said in one line: "no space left on <folder>: N MB needed,
M free", exit 2, no traceback, and the previous checkpoint stays whole (the writer is atomic).

A checkpoint that did not fit ended the run with torch's `RuntimeError: [enforce fail at
inline_container.cc:672] . unexpected pos ...` as an internal failure (exit 70, a traceback)."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAST

from inceptionlab import fileio
from inceptionlab.checkpoint import load_checkpoint
from inceptionlab.errors import UserError

RECIPE = "inception_v3/imagefolder"
SMALL_CNN = ["model.name=cifar10_cnn", "data.train_crop_size=32", "data.val_resize_size=32", "data.val_crop_size=32"]


class DiskFillsUp(io.RawIOBase):
    """A real file whose writes raise ENOSPC once `room` bytes have gone in (a partial write first)."""

    def __init__(self, handle: io.BufferedWriter, room: int):
        self.handle, self.room = handle, room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.room:
            self.handle.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        if not self.handle.closed:
            self.handle.flush()

    def fileno(self) -> int:
        return self.handle.fileno()

    def close(self) -> None:
        super().close()
        self.handle.close()


def full_disk_after(monkeypatch, room: int, which=lambda fd_path: True):
    """Patch the atomic writer's file objects: those `which` picks fill up after `room` bytes."""
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        return DiskFillsUp(handle, room) if which(os.readlink(f"/proc/self/fd/{fd}")) else handle

    monkeypatch.setattr(fileio.os, "fdopen", fdopen)


def test_a_write_that_does_not_fit_names_the_folder_and_sizes_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "last.pt"
    fileio.atomic_torch_save({"weights": torch.zeros(1000)}, target)
    before = target.read_bytes()
    full_disk_after(monkeypatch, room=1000)
    with pytest.raises(UserError) as caught:
        fileio.atomic_torch_save({"weights": torch.zeros(3_000_000)}, target)  # 12 MB
    assert re.match(rf"no space left on {re.escape(str(tmp_path))}: 12\.0 MB needed, \d+\.\d MB free",
                    str(caught.value))
    assert target.read_bytes() == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["last.pt"]  # the temp file is gone


def test_a_full_disk_at_a_checkpoint_is_a_one_line_user_error_and_resume_finishes(image_folder, tmp_path, cli,
                                                                                  monkeypatch):
    written = {"last": 0}

    def second_last_checkpoint(path: str) -> bool:
        if Path(path).name.startswith(".last.pt."):
            written["last"] += 1
            return written["last"] == 2  # epoch 2's last.pt does not fit
        return False

    full_disk_after(monkeypatch, room=4096, which=second_last_checkpoint)
    sets = [x for item in [*FAST, *SMALL_CNN] for x in ("--set", item)]
    failed = cli("train", RECIPE, "--data", image_folder, "--out", tmp_path / "runs", "--no-progress", *sets)
    assert failed.code == 2
    assert failed.err.startswith("error: no space left on ") and "MB needed" in failed.err
    assert len(failed.err.strip().splitlines()) == 1 and "Traceback" not in failed.err
    (run,) = (tmp_path / "runs" / "inception_v3" / "imagefolder").iterdir()
    assert load_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 1  # epoch 1's, whole
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]

    monkeypatch.undo()
    resumed = cli("train", "--resume", run, "--no-progress", "--json")
    assert resumed.code == 0, resumed.err
    assert json.loads(resumed.out.strip().splitlines()[-1])["epochs_done"] == 2


def test_on_a_real_full_tmpfs(image_folder, tmp_path, cli):
    """The same on a real 'disk': a tmpfs sized to hold the first epoch's files, mounted in a user and
    mount namespace of its own (`unshare`), so no root is needed where user namespaces are allowed."""
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {tmp_path} && umount {tmp_path}"],
                           capture_output=True, text=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (unshare --user --mount: {probe.stderr.strip() if probe else 'absent'})")
    sets = [x for item in [*FAST, *SMALL_CNN] for x in ("--set", item)]
    # One epoch on a roomy disk says how big the files of the first epoch are.
    # In this process (the sizing and the resume): a Python start-up with torch costs 3-5 s on 2 busy cores.
    sizing = cli("train", RECIPE, "--data", image_folder, "--out", tmp_path / "sizing", "--no-progress", *sets,
                 "--set", "train.epochs=1")
    assert sizing.code == 0, sizing.err[-2000:]
    (sized,) = (tmp_path / "sizing" / "inception_v3" / "imagefolder").iterdir()
    checkpoint = (sized / "checkpoints" / "last.pt").stat().st_size
    first_epoch = [sized / name for name in ("recipe.resolved.yaml", "env.json", "spec.json", "metrics.jsonl",
                                             "confusion.csv", "plots/samples.png")] + list((sized / "tb").iterdir())
    pages = sum(-(-path.stat().st_size // 4096) + 1 for path in first_epoch)
    # Epoch 1: its files plus last.pt and best.pt; epoch 2's last.pt (written beside the old one) cannot fit.
    size = pages * 4096 + 2 * checkpoint + checkpoint // 2 + 16 * 4096
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size={size} tmpfs {disk} && "
              f"{sys.executable} -m inceptionlab train {RECIPE} --data {image_folder} --out {disk} --no-progress "
              + " ".join(f"--set {item}" for item in [*FAST, *SMALL_CNN]) +
              f"; echo $? > {tmp_path / 'rc'}; cp -a {disk} {kept}")
    ran = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script],
                         capture_output=True, text=True, timeout=300)
    assert (tmp_path / "rc").read_text().strip() == "2", ran.stderr[-3000:]
    assert "error: no space left on " in ran.stderr and "Traceback" not in ran.stderr
    (run,) = (kept / "inception_v3" / "imagefolder").iterdir()
    assert load_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 1
    resumed = cli("train", "--resume", run, "--no-progress", "--json")
    assert resumed.code == 0, resumed.err[-2000:]
    assert json.loads(resumed.out.strip().splitlines()[-1])["epochs_done"] == 2
