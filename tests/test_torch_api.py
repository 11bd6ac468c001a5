"""The code keeps to what the GPU image's torch 2.11 / torchvision 0.26 have (tools/torch_api.py): every
attribute chain rooted at torch or torchvision in src/, benchmarks/, tests/ and tools/ walks through names
recorded from those versions (tools/torch_api.json), without installing them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))  # a make-time tool, outside the package
import gpu_offline  # noqa: E402
import torch_api  # noqa: E402

RECORD = json.loads(torch_api.RECORD.read_text())


def test_the_code_uses_only_what_torch_2_11_and_torchvision_0_26_have():
    uses, guarded = torch_api.scan(torch_api.python_files())

    problems = torch_api.check(uses, guarded, RECORD)

    assert len(uses) > 500  # the scan really reads the code: an empty scan would pass anything
    assert [str(problem) for problem in problems] == []


def test_the_record_is_of_the_gpu_images_versions():
    image = gpu_offline.Image.read()

    assert (RECORD["torch"], RECORD["torchvision"]) == (image.packages["torch"], image.packages["torchvision"])
    assert "set_sync_debug_mode" in RECORD["names"]["torch.cuda"]


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / "src" / "module.py"
    path.write_text(text)
    return path


def problems_in(tmp_path: Path, text: str) -> list[str]:
    uses, guarded = torch_api.scan([write(tmp_path, text)], repo=tmp_path)
    return [str(problem) for problem in torch_api.check(uses, guarded, RECORD)]


def test_an_api_newer_than_torch_2_11_is_caught_however_it_is_imported(tmp_path):
    # torch 2.14 added torch.nn.functional.linear_cross_entropy and torch.nn.LinearCrossEntropyLoss.
    found = problems_in(tmp_path, "\n".join([
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        "from torch.nn import LinearCrossEntropyLoss",
        "def loss(x, w, y):",
        "    a = F.linear_cross_entropy(x, w, y)",
        "    b = nn.LinearCrossEntropyLoss()(x, w, y)",
        "    c = torch.nn.functional.linear_cross_entropy(x, w, y).sum()",
        "    return F.interpolate(x, 2), torch.cuda.set_sync_debug_mode, a, b, c",  # these exist in 2.11
    ]))

    assert [line.split(": ")[0] for line in found] == ["src/module.py:4", "src/module.py:6", "src/module.py:7",
                                                      "src/module.py:8"]
    assert "torch.nn has no 'LinearCrossEntropyLoss' in torch 2.11.0 / torchvision 0.26.0" in found[0]


def test_a_use_guarded_by_hasattr_is_allowed_and_an_unrecorded_namespace_asks_for_a_refresh(tmp_path):
    found = problems_in(tmp_path, "\n".join([
        "import torch.nn.functional as F",
        "import torchvision",
        "fast = F.linear_cross_entropy if hasattr(F, 'linear_cross_entropy') else None",
        "x = torchvision.io.decode_image",
        "y = torchvision.no_such_module.thing",
        "z = torch.float32.itemsize",  # torch.float32's own names were never recorded
        "import torch",
    ]))

    assert [line.split(": ")[0] for line in found] == ["src/module.py:5", "src/module.py:6"]
    assert "torchvision has no 'no_such_module'" in found[0]
    assert "torch.float32 is not in the record of torch 2.11.0 / torchvision 0.26.0: refresh it" in found[1]
