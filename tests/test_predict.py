"""`inceptionlab predict`: pretrained models from the hub cache, trained runs, and bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image


@pytest.fixture(scope="module")
def trained_run(squares_run):
    return squares_run.run_dir, squares_run.data


def parse_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.strip().splitlines()]


def test_pretrained_top5_json_on_the_guides_dog(inception_hub, sample_photos, cli):
    dog = sample_photos / "dog.jpg"
    result = cli("predict", dog, "--json")
    assert result.code == 0, result.err
    [row] = parse_lines(result.out)
    assert row["file"] == str(dog) and len(row["topk"]) == 5
    probs = [t["prob"] for t in row["topk"]]
    assert probs == sorted(probs, reverse=True) and all(0 <= p <= 1 for p in probs)
    names = torchvision.models.Inception_V3_Weights.IMAGENET1K_V1.meta["categories"]
    assert all(names[t["index"]] == t["label"] for t in row["topk"])  # labels come with the weights


def test_pretrained_table_over_a_directory(inception_hub, sample_photos, cli):
    images = sample_photos
    result = cli("predict", images, "--topk", "3", "--batch-size", "2")
    assert result.code == 0, result.err
    for name in ("dog.jpg", "cat.jpg", "eagle.jpg"):
        assert name in result.out
    assert result.out.count("(class ") == 3 * len(list(images.glob("*.jpg")))


def test_missing_weights_is_one_line_not_a_traceback(tmp_path, cli, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "empty"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    result = cli("predict", tmp_path, "--model", "inception_v3")
    assert result.code == 2
    assert "inception_v3_google-0cc3c7bd.pth" in result.err and "Traceback" not in result.err
    # The attempt said before it is made (issue 43: torch's own 'Downloading:' line came first), then the error.
    said, error = result.err.strip().splitlines()
    assert "downloading https://download.pytorch.org/models/inception_v3_google-0cc3c7bd.pth" in said
    assert error.startswith("error: inception_v3 ImageNet weights not found and not downloadable")


def make_bad_inputs(folder):
    """Every awkward input the issue lists; returns {file name: should it succeed?}."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (60, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(folder / "good.jpg")
    Image.fromarray(rgb[..., 0]).save(folder / "gray.png")
    Image.fromarray(np.dstack([rgb, np.full((60, 50), 128, np.uint8)])).save(folder / "rgba.png")
    Image.fromarray(rgb).convert("P").save(folder / "palette.png")
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg")
    Image.fromarray((rgb[..., 0].astype(np.uint16) * 257)).save(folder / "sixteen.png")
    Image.fromarray(rng.integers(0, 255, (3000, 2500, 3), dtype=np.uint8)).save(folder / "huge.jpg", quality=50)
    good = (folder / "good.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (folder / "notes.jpg").write_text("this is not an image")
    return {"good.jpg": True, "gray.png": True, "rgba.png": True, "palette.png": True, "cmyk.jpg": True,
            "sixteen.png": True, "huge.jpg": True, "truncated.jpg": False, "notes.jpg": False}


def test_bad_inputs_each_get_one_line_and_good_ones_are_classified(trained_run, tmp_path, cli):
    run_dir, _ = trained_run
    expected = make_bad_inputs(tmp_path / "inputs")
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    result = cli("predict", "--run", run_dir, tmp_path / "inputs", tmp_path / "missing.jpg", empty, "--json")
    assert result.code == 1, "any failed input makes the exit status non-zero"
    rows = {r["file"]: r for r in parse_lines(result.out)}
    for name, ok in expected.items():
        row = rows[str(tmp_path / "inputs" / name)]
        assert ("topk" in row) is ok, (name, row)
        if not ok:
            assert name in row["error"] and "\n" not in row["error"]
        else:
            assert {t["label"] for t in row["topk"]} <= {"cat", "dog", "fox"}
    assert "error" in rows[str(tmp_path / "missing.jpg")]
    assert "no images" in rows[str(empty)]["error"]


def test_run_prediction_uses_the_runs_classes_and_preprocessing(trained_run, cli):
    run_dir, data = trained_run
    result = cli("predict", "--run", run_dir, data / "val", "--json", "--topk", "2")
    assert result.code == 0, result.err
    rows = parse_lines(result.out)
    assert len(rows) == 9 and all(len(r["topk"]) == 2 for r in rows)
    assert {t["label"] for r in rows for t in r["topk"]} <= {"cat", "dog", "fox"}


def test_json_answers_come_in_the_order_of_the_inputs(inception_hub, sample_photos, tmp_path, cli):
    """Errors used to come first, before every classified file: a script zipping inputs with answers
    paired the wrong ones."""
    empty = tmp_path / "empty"
    empty.mkdir()
    inputs = [sample_photos / "dog.jpg", tmp_path / "missing.jpg", sample_photos / "cat.jpg", empty,
              sample_photos / "eagle.jpg"]
    result = cli("predict", *inputs, "--model", "inception_v3", "--json", "--batch-size", "2")
    assert result.code == 1
    rows = parse_lines(result.out)
    assert [r["file"] for r in rows] == [str(p) for p in inputs]
    assert ["topk" in r for r in rows] == [True, False, True, False, True]


def test_a_run_directory_given_first_is_the_model_as_in_evaluate_and_serve(trained_run, cli):
    """`evaluate RUN`, `export RUN` and `serve RUN` take the run first; `predict RUN photos/` must not
    classify the run's own plots with the pretrained ImageNet model (and fail for want of its weights)."""
    run_dir, data = trained_run
    result = cli("predict", run_dir, data / "val", "--json", "--topk", "2")
    assert result.code == 0, result.err
    rows = parse_lines(result.out)
    assert len(rows) == 9 and all(str(data / "val") in r["file"] for r in rows)
    assert {t["label"] for r in rows for t in r["topk"]} <= {"cat", "dog", "fox"}


def test_a_run_directory_among_the_images_with_run_given_is_refused(trained_run, cli):
    run_dir, data = trained_run
    result = cli("predict", "--run", run_dir, data / "val", run_dir)
    assert result.code == 2 and result.out == ""
    assert f"{run_dir} is a run directory, not images to classify" in result.err


def test_files_a_folder_holds_besides_images_are_named_not_skipped_silently(trained_run, tmp_path, cli):
    """A phone's export folder holds videos and sidecars beside the photos: predict classifies the photos
    and says on stderr what it left out, as training and the data check do; --json output stays JSON."""
    photos = tmp_path / "photos"
    (photos / "trip").mkdir(parents=True)
    rgb = np.random.default_rng(1).integers(0, 255, (40, 30, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(photos / "a.jpg")
    Image.fromarray(rgb).save(photos / "trip" / "b.png")
    (photos / "trip" / "clip.mov").write_bytes(b"\x00\x00\x00\x18ftypqt  ")
    (photos / "a.xmp").write_text("<x:xmpmeta/>")
    (photos / ".DS_Store").write_bytes(b"\x00")  # hidden: never a photo, not worth a word
    for extra in ([], ["--json"]):
        result = cli("predict", "--run", trained_run[0], photos, *extra)
        assert result.code == 0, result.err
        notes = [line for line in result.err.splitlines() if "non-image" in line]
        assert notes == [f"note: {photos}: ignored 2 non-image file(s), e.g. {photos / 'a.xmp'}"]
        assert ".DS_Store" not in result.err
        if extra:
            assert [row["file"] for row in parse_lines(result.out)] == [str(photos / "a.jpg"),
                                                                        str(photos / "trip" / "b.png")]


def test_a_folder_of_photos_is_decoded_on_several_threads_with_the_same_answers(trained_run, tmp_path, monkeypatch):
    """A phone photo takes ~40 ms to decode even at 1/8 scale (12 MP, AMD EPYC Zen 3), far more than a
    small model or a GPU takes to classify it: predict decodes a batch's files side by side, and answers
    exactly as one thread does, in the same order, errors included."""
    import threading

    from inceptionlab.infer import predict as predict_module
    from inceptionlab.models.registry import load_run_model

    folder = tmp_path / "photos"
    readable = make_bad_inputs(folder)
    threads = set()
    load = predict_module.load_rgb

    def recording_load(path, **kwargs):
        threads.add(threading.get_ident())
        return load(path, **kwargs)

    monkeypatch.setattr(predict_module, "load_rgb", recording_load)
    net, spec = load_run_model(trained_run[0])
    answers = {}
    for workers in (1, 4):
        predictor = predict_module.Predictor(net, spec, torch.device("cpu"), decode_threads=workers)
        threads.clear()
        answers[workers] = list(predictor.predict_files([folder], topk=2, batch_size=8))
        assert (len(threads) > 1) == (workers > 1)
    assert answers[1] == answers[4]
    assert [(row["file"], "error" not in row) for row in answers[4]] == [
        (str(folder / name), ok) for name, ok in sorted(readable.items())]
