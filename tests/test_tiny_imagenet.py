"""`inceptionlab data tiny-imagenet`: fetch, safe unzip, validated and restartable val regroup."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from conftest import shared_data
from inceptionlab.data.datasets import tiny_imagenet as ti
from inceptionlab.data.io.archives import safe_extract_zip
from inceptionlab.data.io.download import fetch
from inceptionlab.errors import UserError
from helpers.page_examples import check_example

DIRNAME = "tiny-imagenet-200"
WNIDS = ["n01443537", "n01629819", "n01641577"]
WORDS = {
    "n00001740": "entity",
    "n01443537": "goldfish, Carassius auratus",
    "n01629819": "European fire salamander, Salamandra salamandra",
    "n01641577": "bullfrog, Rana catesbeiana",
}
VAL_PER_CLASS = 3
TRAIN_PER_CLASS = 2
TEST_IMAGES = 2


# --- helpers -----------------------------------------------------------------------------------


def tiny_jpeg(seed: int) -> bytes:
    """A distinct 8x8 JPEG per seed, so content checks can tell images apart."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), ((seed * 37) % 256, (seed * 91) % 256, (seed * 13) % 256)).save(buffer, "JPEG")
    return buffer.getvalue()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file below `folder`."""
    return {str(p.relative_to(folder)): sha(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def identities(folder: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (device, inode) of every file: a rename keeps it, a copy or rewrite does not."""
    return {str(p.relative_to(folder)): (st.st_dev, st.st_ino)
            for p in sorted(folder.rglob("*")) if p.is_file() and (st := p.stat())}


def expected_after_regroup(original: dict, annotations: Path) -> dict:
    """What a complete regroup must produce from an original-layout snapshot: same files, new paths."""
    wnid_of = dict(line.split("\t")[:2] for line in annotations.read_text().splitlines() if line)
    expected = {}
    for rel, digest in original.items():
        if rel.startswith("val/images/"):
            name = rel.removeprefix("val/images/")
            rel = f"val/{wnid_of[name]}/images/{name}"
        expected[rel] = digest
    return expected


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Room for the real-data trees: RAM-backed /dev/shm where there is one, else pytest's tmp dir.

    Creating and deleting 14,000 small files can take a minute on a busy virtual disk; in RAM it
    takes a fraction of a second. Removed at the end of the module either way.
    """
    shm = Path("/dev/shm")
    use_shm = shm.is_dir() and os.access(shm, os.W_OK)
    if use_shm:
        base = Path(tempfile.mkdtemp(prefix="inceptionlab-tiny-", dir=shm))
    else:
        base = tmp_path_factory.mktemp("real")
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def pristine_real(scratch) -> Path:
    """One writable copy of the real (read-only) data set, made once for this module."""
    dataset = scratch / "pristine" / DIRNAME
    shutil.copytree(shared_data(DIRNAME), dataset, copy_function=shutil.copyfile)
    for folder, _, _ in os.walk(dataset):
        os.chmod(folder, 0o755)  # copytree copied the source folders' read-only mode
    return dataset


@pytest.fixture
def real_dataset(pristine_real, scratch):
    """A fresh ROOT/tiny-imagenet-200 in the original layout, as hard links to the pristine copy.

    Linking is cheaper than copying and safe: prepare only renames files, and a rename in this
    tree leaves the pristine tree's names untouched.
    """
    root = Path(tempfile.mkdtemp(dir=scratch))
    dataset = root / DIRNAME
    shutil.copytree(pristine_real, dataset, copy_function=os.link)
    yield dataset
    shutil.rmtree(root, ignore_errors=True)


def assert_same_bytes_as_source(dataset: Path, names: list[str]) -> None:
    """Spot-check content against the shared originals (identities() already proves no copies)."""
    source = shared_data(DIRNAME)
    annotations = (source / "val" / "val_annotations.txt").read_text().splitlines()
    wnid_of = dict(line.split("\t")[:2] for line in annotations)
    for name in names:
        assert sha(dataset / "val" / wnid_of[name] / "images" / name) == sha(source / "val" / "images" / name)


def build_synthetic(root: Path) -> Path:
    """An original-layout Tiny ImageNet with 3 classes, small enough to make in milliseconds."""
    dataset = root / DIRNAME
    (dataset / "val" / "images").mkdir(parents=True)
    (dataset / "test" / "images").mkdir(parents=True)
    (dataset / "wnids.txt").write_text("".join(f"{w}\n" for w in WNIDS))
    (dataset / "words.txt").write_text("\n".join(f"{w}\t{words}" for w, words in WORDS.items()))
    seed = 0
    for wnid in WNIDS:
        images = dataset / "train" / wnid / "images"
        images.mkdir(parents=True)
        boxes = []
        for k in range(TRAIN_PER_CLASS):
            (images / f"{wnid}_{k}.JPEG").write_bytes(tiny_jpeg(seed := seed + 1))
            boxes.append(f"{wnid}_{k}.JPEG\t0\t0\t7\t7\n")
        (dataset / "train" / wnid / f"{wnid}_boxes.txt").write_text("".join(boxes))
    lines = []
    for i in range(VAL_PER_CLASS * len(WNIDS)):
        (dataset / "val" / "images" / f"val_{i}.JPEG").write_bytes(tiny_jpeg(seed := seed + 1))
        lines.append(f"val_{i}.JPEG\t{WNIDS[i % len(WNIDS)]}\t0\t1\t6\t7\n")
    (dataset / "val" / "val_annotations.txt").write_text("".join(lines))
    for i in range(TEST_IMAGES):
        (dataset / "test" / "images" / f"test_{i}.JPEG").write_bytes(tiny_jpeg(seed := seed + 1))
    return root


@pytest.fixture
def synthetic(tmp_path) -> Path:
    """The folder that contains a synthetic tiny-imagenet-200/."""
    return build_synthetic(tmp_path / "synthetic")


def zip_folder(container: Path, zip_path: Path, extra: dict[str, bytes] | None = None) -> Path:
    """Zip container/tiny-imagenet-200 the way the official archive is laid out (one top folder)."""
    with zipfile.ZipFile(zip_path, "w") as zf:
        for path in sorted((container / DIRNAME).rglob("*")):
            arcname = str(path.relative_to(container)) + ("/" if path.is_dir() else "")
            if path.is_dir():
                zf.writestr(arcname, b"")
            else:
                zf.write(path, arcname)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return zip_path


class Crash(Exception):
    """Stands in for the process being killed at an arbitrary point."""


def crash_after(monkeypatch, calls: int) -> None:
    """Let `calls` os.replace calls through, then fail the next one as a kill would."""
    real_replace, done = os.replace, [0]

    def flaky_replace(src, dst):
        if done[0] >= calls:
            raise Crash(f"killed before moving {src}")
        done[0] += 1
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)


# --- real data ---------------------------------------------------------------------------------


def test_real_data_prepare_then_rerun_is_a_noop(real_dataset):
    dataset = real_dataset
    original = identities(dataset)

    report = ti.prepare_tiny_imagenet(dataset.parent, progress=False)

    assert report.dataset == dataset
    assert report.moved == 10_000 and report.classes == 200
    assert report.val == ti.SplitCounts(10_000, 50, 50)
    assert report.train == ti.SplitCounts(4_000, 20, 20)
    assert report.test.images == 200
    assert not (dataset / "val" / "images").exists()
    class_dirs = [p for p in (dataset / "val").iterdir() if p.is_dir()]
    assert len(class_dirs) == 200
    assert {len(list((d / "images").iterdir())) for d in class_dirs} == {50}
    after = identities(dataset)
    after.pop(ti.MARKER_NAME)
    assert after == expected_after_regroup(original, dataset / "val" / "val_annotations.txt")
    assert_same_bytes_as_source(dataset, ["val_0.JPEG", "val_4999.JPEG", "val_9999.JPEG"])
    assert json.loads((dataset / ti.MARKER_NAME).read_text())["val"]["images"] == 10_000

    # Second run, given the dataset folder itself this time: nothing moves, nothing is rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in dataset.rglob("*")}
    again = ti.prepare_tiny_imagenet(dataset, progress=False)
    assert again.moved == 0 and again.extracted == 0
    assert again.counts() == report.counts()
    assert {p: p.stat().st_mtime_ns for p in dataset.rglob("*")} == stamps


def test_real_class_names_come_from_words_txt():
    dataset = shared_data(DIRNAME)
    names = ti.read_class_names(dataset.parent)
    assert len(names) == 200 and list(names) == ti.read_wnids(dataset)
    assert names["n01443537"] == "goldfish"
    assert len(set(names.values())) == 200  # first synonyms are unique labels
    assert ti.read_class_names(dataset, full=True)["n01443537"] == "goldfish, Carassius auratus"


def test_real_data_regroup_survives_a_crash(real_dataset, monkeypatch):
    dataset = real_dataset
    expected = expected_after_regroup(identities(dataset), dataset / "val" / "val_annotations.txt")

    with monkeypatch.context() as m:
        crash_after(m, 3_000)
        with pytest.raises(Crash):
            ti.prepare_tiny_imagenet(dataset.parent, progress=False)
    assert len(list((dataset / "val" / "images").iterdir())) == 7_000  # really cut off midway

    report = ti.prepare_tiny_imagenet(dataset.parent, progress=False)

    assert report.moved == 7_000 and report.val == ti.SplitCounts(10_000, 50, 50)
    after = identities(dataset)
    after.pop(ti.MARKER_NAME)
    assert after == expected  # same names, same files: nothing lost, nothing duplicated
    assert_same_bytes_as_source(dataset, ["val_0.JPEG", "val_2999.JPEG", "val_3000.JPEG", "val_9999.JPEG"])


def test_cli_json_on_real_data(real_dataset, cli):
    result = cli("data", "tiny-imagenet", "--root", real_dataset.parent, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["classes"] == 200
    assert report["train"] == {"images": 4000, "per_class_min": 20, "per_class_max": 20}
    assert report["val"] == {"images": 10000, "per_class_min": 50, "per_class_max": 50}
    assert report["test"] == {"images": 200}
    assert report["actions"]["moved"] == 10000


# --- restartability on synthetic data ----------------------------------------------------------


@pytest.mark.parametrize("moves_before_crash", [0, 1, 5, 9])  # 9 = all moved, killed writing the marker
def test_regroup_restarts_after_crash_at_any_point(synthetic, monkeypatch, moves_before_crash):
    dataset = synthetic / DIRNAME
    expected = expected_after_regroup(snapshot(dataset), dataset / "val" / "val_annotations.txt")

    with monkeypatch.context() as m:
        crash_after(m, moves_before_crash)
        with pytest.raises(Crash):
            ti.prepare_tiny_imagenet(synthetic, progress=False)
    assert not (dataset / ti.MARKER_NAME).exists()

    report = ti.prepare_tiny_imagenet(synthetic, progress=False)
    assert report.moved == 9 - moves_before_crash
    assert report.val == ti.SplitCounts(9, 3, 3) and report.train == ti.SplitCounts(6, 2, 2)
    after = snapshot(dataset)
    after.pop(ti.MARKER_NAME)
    assert after == expected


# --- validation errors: each names the file/line, and nothing moves ----------------------------


def replace_annotation_line(dataset: Path, number: int, text: str) -> None:
    path = dataset / "val" / "val_annotations.txt"
    lines = path.read_text().splitlines(keepends=True)
    lines[number - 1] = text + "\n"
    path.write_text("".join(lines))


BROKEN = {
    "too few fields": (
        lambda d: replace_annotation_line(d, 2, "val_1.JPEG\tn01629819\t0\t1\t6"),
        r"val_annotations\.txt:2: expected 6 tab-separated fields",
    ),
    "box not integers": (
        lambda d: replace_annotation_line(d, 4, "val_3.JPEG\tn01443537\t0\tx\t6\t7"),
        r"val_annotations\.txt:4: box .* not four integers",
    ),
    "unknown wnid": (
        lambda d: replace_annotation_line(d, 3, "val_2.JPEG\tn09999999\t0\t1\t6\t7"),
        r"val_annotations\.txt:3: wnid 'n09999999' is not in wnids\.txt",
    ),
    "listed but missing": (
        lambda d: (d / "val" / "images" / "val_4.JPEG").unlink(),
        r"val_annotations\.txt:5: val_4\.JPEG is listed but is neither at .*val/images/val_4\.JPEG",
    ),
    "unlisted extra image": (
        lambda d: (d / "val" / "images" / "extra.JPEG").write_bytes(tiny_jpeg(99)),
        r"val/images/extra\.JPEG is not listed in .*val_annotations\.txt",
    ),
    "image in both places": (
        lambda d: shutil.copytree(d / "val" / "images", d / "val" / "n01443537" / "images",
                                  ignore=lambda _, names: [n for n in names if n != "val_0.JPEG"]),
        r"val/images/val_0\.JPEG and .*val/n01443537/images/val_0\.JPEG both exist",
    ),
    "words.txt lacks a class": (
        lambda d: (d / "words.txt").write_text("n01443537\tgoldfish\n"),
        r"words\.txt has no line for n01629819",
    ),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_invalid_dataset_is_refused_before_moving_anything(synthetic, case):
    break_it, message = BROKEN[case]
    dataset = synthetic / DIRNAME
    break_it(dataset)
    before = snapshot(dataset)

    with pytest.raises(UserError, match=message) as error:
        ti.prepare_tiny_imagenet(synthetic, progress=False)

    assert "\n" not in str(error.value)
    assert snapshot(dataset) == before
    assert not (dataset / ti.MARKER_NAME).exists()


def test_every_problem_is_counted_in_the_message(synthetic):
    dataset = synthetic / DIRNAME
    for name in ("a.JPEG", "b.JPEG", "c.JPEG"):
        (dataset / "val" / "images" / name).write_bytes(b"x")
    with pytest.raises(UserError, match=r"a\.JPEG is not listed .*\(and 2 more problems; nothing was moved\)"):
        ti.prepare_tiny_imagenet(synthetic, progress=False)


def test_cli_prints_the_counts_of_each_split(synthetic, cli):
    result = cli("data", "tiny-imagenet", "--root", synthetic)
    assert result.code == 0, result.err
    check_example("first-steps-tiny-imagenet", result.out)


def test_cli_error_is_one_line_and_exit_2(synthetic, cli):
    replace_annotation_line(synthetic / DIRNAME, 3, "val_2.JPEG\tn09999999\t0\t1\t6\t7")
    result = cli("data", "tiny-imagenet", "--root", synthetic)
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "val_annotations.txt:3" in lines[0] and "n09999999" in lines[0]


# --- zip archives ------------------------------------------------------------------------------


def test_archive_is_extracted_and_prepared(synthetic, tmp_path, cli):
    archive = zip_folder(synthetic, tmp_path / "tiny-imagenet-200.zip")
    root = tmp_path / "fresh"
    result = cli("data", "tiny-imagenet", "--root", root, "--archive", archive, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["actions"] == {"downloaded": False, "extracted": 23, "moved": 9}
    assert report["val"] == {"images": 9, "per_class_min": 3, "per_class_max": 3}
    assert not (root / DIRNAME / "val" / "images").exists()

    # Passing the archive again must not bring back val/images from the zip.
    again = ti.prepare_tiny_imagenet(root, archive=archive, progress=False)
    assert again.moved == 0 and again.extracted == 0
    assert again.counts() == {key: report[key] for key in ("classes", "train", "val", "test")}
    assert not (root / DIRNAME / "val" / "images").exists()


def test_the_text_report_gives_per_class_counts_as_first_steps_shows(synthetic, tmp_path, cli):
    archive = zip_folder(synthetic, tmp_path / "tiny-imagenet-200.zip")
    result = cli("data", "tiny-imagenet", "--root", tmp_path / "fresh", "--archive", archive)
    assert result.code == 0, result.err
    assert any(line.split() == ["val", "9", "images", "(3-3", "per", "class)"] for line in result.out.splitlines())


def test_rerun_after_partial_extraction_completes(synthetic, tmp_path, monkeypatch):
    dataset = synthetic / DIRNAME
    expected = expected_after_regroup(snapshot(dataset), dataset / "val" / "val_annotations.txt")
    archive = zip_folder(synthetic, tmp_path / "a.zip")
    root = tmp_path / "fresh"

    with monkeypatch.context() as m:
        crash_after(m, 8)  # 8 of the 23 files extracted
        with pytest.raises(Crash):
            ti.prepare_tiny_imagenet(root, archive=archive, progress=False)
    partial = [p for p in (root / DIRNAME).rglob("*") if p.is_file()]
    assert len([p for p in partial if not p.name.startswith(".")]) == 8

    report = ti.prepare_tiny_imagenet(root, archive=archive, progress=False)
    assert report.extracted == 23 - 8 and report.moved == 9
    after = snapshot(root / DIRNAME)
    after.pop(ti.MARKER_NAME)
    assert after == expected  # also: no `.extracting` temporaries left behind


@pytest.mark.parametrize("member", ["../evil", "/abs/evil", "tiny-imagenet-200/../../evil"])
def test_zip_member_escaping_destination_is_refused(synthetic, tmp_path, member):
    archive = zip_folder(synthetic, tmp_path / "bad.zip", extra={member: b"pwned"})
    root = tmp_path / "out" / "root"
    with pytest.raises(UserError, match=r"bad\.zip: member .*evil.*refusing to extract"):
        ti.prepare_tiny_imagenet(root, archive=archive, progress=False)
    assert not list(tmp_path.rglob("evil"))
    assert not (root / DIRNAME).exists()  # checked before anything was written


def test_zip_symlink_member_is_refused(tmp_path):
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("ok.txt", b"fine")
        link = zipfile.ZipInfo("escape")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "/etc/passwd")
    with pytest.raises(UserError, match=r"'escape' is a symbolic link"):
        safe_extract_zip(archive, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "ok.txt").exists()


def test_archive_without_top_folder_is_refused(tmp_path):
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("wnids.txt", b"n01443537\n")
    with pytest.raises(UserError, match=r"other\.zip has no tiny-imagenet-200/wnids\.txt"):
        ti.prepare_tiny_imagenet(tmp_path / "root", archive=archive, progress=False)


def test_missing_or_corrupt_archive_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"archive .*nope\.zip not found"):
        ti.prepare_tiny_imagenet(tmp_path, archive=tmp_path / "nope.zip", progress=False)
    (tmp_path / "junk.zip").write_bytes(b"not a zip")
    with pytest.raises(UserError, match=r"junk\.zip is not a valid zip archive"):
        ti.prepare_tiny_imagenet(tmp_path, archive=tmp_path / "junk.zip", progress=False)


# --- fetch over loopback HTTP ------------------------------------------------------------------

PAYLOAD = bytes((i * 7 + i // 251) % 256 for i in range(300_000))


class RangeHandler(BaseHTTPRequestHandler):
    """Serves PAYLOAD at /file (honours `Range: bytes=N-`) and at /norange (ignores Range)."""

    ranges_seen: list[str | None] = []
    body = PAYLOAD

    def do_GET(self):
        if self.path not in ("/file", "/norange"):
            self.send_error(404)
            return
        requested = self.headers.get("Range")
        type(self).ranges_seen.append(requested)
        start = 0
        if requested and self.path == "/file":
            start = int(requested.removeprefix("bytes=").rstrip("-"))
        if start >= len(self.body) and start:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(self.body)}")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(self.body) - 1}/{len(self.body)}")
        self.send_header("Content-Length", str(len(self.body) - start))
        self.end_headers()
        self.wfile.write(self.body[start:])

    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def server(monkeypatch):
    """A loopback HTTP server in a thread; yields its base URL."""
    monkeypatch.setenv("no_proxy", "*")  # never send loopback requests through a proxy
    RangeHandler.ranges_seen = []
    RangeHandler.body = PAYLOAD
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_fetch_resumes_a_partial_download(server, tmp_path):
    dest = tmp_path / "payload.bin"
    half = len(PAYLOAD) // 2
    (tmp_path / "payload.bin.part").write_bytes(PAYLOAD[:half])

    fetch(f"{server}/file", dest, sha256=hashlib.sha256(PAYLOAD).hexdigest(), progress=False)

    assert RangeHandler.ranges_seen == [f"bytes={half}-"]
    assert dest.read_bytes() == PAYLOAD
    assert not (tmp_path / "payload.bin.part").exists()


def test_fetch_starts_over_when_server_ignores_range(server, tmp_path):
    dest = tmp_path / "payload.bin"
    (tmp_path / "payload.bin.part").write_bytes(b"\0" * 1000)  # would corrupt the file if appended to
    fetch(f"{server}/norange", dest, md5=hashlib.md5(PAYLOAD).hexdigest(), progress=False)
    assert dest.read_bytes() == PAYLOAD


def test_fetch_with_complete_part_verifies_and_renames(server, tmp_path):
    dest = tmp_path / "payload.bin"
    (tmp_path / "payload.bin.part").write_bytes(PAYLOAD)
    fetch(f"{server}/file", dest, sha256=hashlib.sha256(PAYLOAD).hexdigest(), progress=False)
    assert dest.read_bytes() == PAYLOAD


def test_fetch_wrong_checksum_leaves_nothing(server, tmp_path):
    dest = tmp_path / "payload.bin"
    mismatch = r"sha256 is [0-9a-f]{64}, expected 0{64}.*nothing was written to .*payload\.bin"
    with pytest.raises(UserError, match=mismatch):
        fetch(f"{server}/file", dest, sha256="0" * 64, progress=False)
    assert not dest.exists()
    assert not (tmp_path / "payload.bin.part").exists()


def closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_error_says_where_to_put_the_zip(tmp_path, monkeypatch):
    monkeypatch.setenv("no_proxy", "*")
    url = f"http://127.0.0.1:{closed_loopback_port()}/tiny-imagenet-200.zip"
    where = r"could not download .*put it at .*root/tiny-imagenet-200\.zip .*--archive"
    with pytest.raises(UserError, match=where):
        ti.prepare_tiny_imagenet(tmp_path / "root", url=url, progress=False)


def test_prepare_downloads_verifies_and_extracts(server, synthetic, tmp_path):
    zipped = zip_folder(synthetic, tmp_path / "served.zip").read_bytes()
    RangeHandler.body = zipped
    root = tmp_path / "root"

    md5 = hashlib.md5(zipped).hexdigest()
    report = ti.prepare_tiny_imagenet(root, url=f"{server}/file", md5=md5, progress=False)

    assert report.downloaded and report.extracted == 23 and report.moved == 9
    assert (root / "tiny-imagenet-200.zip").read_bytes() == zipped
    assert ti.read_class_names(root) == {
        "n01443537": "goldfish", "n01629819": "European fire salamander", "n01641577": "bullfrog",
    }
