"""`inceptionlab predict`: top-k labels for images, from a pretrained model or a trained run."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, List, Optional

import typer

from inceptionlab.cli import options
from inceptionlab.data.io.image_files import left_out_notes, non_images_under
from inceptionlab.errors import UserError

if TYPE_CHECKING:
    from inceptionlab.infer.predict import Predictor


def predict(
    inputs: List[Path] = typer.Argument(None, help="Image files and/or folders of images."),
    text: List[str] = typer.Option([], "--text", help="A text to classify with a text run (repeatable)."),
    text_file: List[Path] = typer.Option([], "--text-file", help="A file of texts, one per line (repeatable)."),
    run: Optional[Path] = options.run_option(),
    model: Optional[str] = options.model_option("a pretrained torchvision model (default without --run: inception_v3)"),
    weights: Optional[str] = options.weights_option(),
    topk: int = typer.Option(5, "--topk", min=1, help="How many classes to show per image."),
    tta: Optional[str] = options.tta_option(),
    explain: Optional[Path] = typer.Option(
        None, "--explain", metavar="DIR",
        help="Also write a Grad-CAM overlay per image into DIR (<name>.cam.png: where the model looked for its "
             "top class); needs the trust extra (Captum)."),
    batch_size: int = options.batch_size_option(16),
    device: str = options.device_option(),
    as_json: bool = options.json_option('one object per input, {"file", "answer", "score", "unknown", "topk"} or '
                                        '{"file", "error"}; answer is "unknown" below a run\'s reject threshold; a '
                                        'text: {"text", "answer", "score", "unknown", "label", "probability"}'),
) -> None:
    """Classify images; exits 1 if any input failed (the others are still classified).

    Examples:

      inceptionlab predict dog.jpg                       # pretrained ImageNet Inception v3, top-5

      inceptionlab predict photos/ --json > preds.jsonl

      inceptionlab predict val/ --run runs/inception_v3/tiny_imagenet/20261122-101500

      inceptionlab predict runs/inception_v3/imagefolder/20261122-101500 photos/   # the run first: the same

      inceptionlab predict --run runs/imdb/text_classifier/20261122-101500 --text "The movie was great!"

      inceptionlab predict dog.jpg --explain cams/       # + cams/dog.cam.png (Grad-CAM of the top class)
    """
    # start-up time: torch (~1-2 s) loads when the command runs, never for `inceptionlab --help`
    from inceptionlab.infer.predict import Predictor
    from inceptionlab.models.registry import load_pretrained_model, load_run_model
    from inceptionlab.runtime import resolve_device

    if (text or text_file) and explain is not None:
        raise UserError("--explain draws Grad-CAM over images; a text model has none to draw on")
    if text or text_file:
        _predict_texts(run, text, text_file, device, as_json)
        return
    run, inputs = _run_given_first(run, model, list(inputs or []))
    if not inputs:
        raise UserError("give image files or folders, or --text / --text-file with a text run")
    if run is not None and model is not None:
        raise UserError("give --run RUN_DIR or --model NAME, not both")
    if run is not None:
        net, spec = load_run_model(run, Path(weights) if weights else None)
    else:
        net, spec = load_pretrained_model(model or "inception_v3", weights or "imagenet")
    predictor = Predictor(net, spec, resolve_device(device), tta=options.check_tta(tta),
                          where=str(run) if run is not None else spec.arch)
    for note in _left_out_notes(inputs):  # stderr: --json keeps stdout to results
        typer.echo(f"note: {note}", err=True)
    results = predictor.predict_files(inputs, topk=topk, batch_size=batch_size)
    if explain is not None:
        results = _with_overlays(predictor, results, explain, batch_size)
    failures = 0
    for result in results:
        failures += "error" in result
        print(json.dumps(result) if as_json else _format(result), flush=True)
    if failures:
        if not as_json:
            typer.echo(f"{failures} input(s) failed", err=True)
        raise typer.Exit(1)


def _with_overlays(predictor: "Predictor", results: Iterable[dict], out_dir: Path, batch_size: int) -> Iterator[dict]:
    """The results as they come, each classified image's with "explain": its Grad-CAM overlay."""
    from inceptionlab.judge.explain import Explainer, OverlayNames  # start-up time: torch, as in predict()

    explainer, names = Explainer(predictor.model, predictor.spec, predictor.device), OverlayNames()
    results = iter(results)
    while chunk := list(islice(results, batch_size)):
        done = [r for r in chunk if "error" not in r]
        paths = explainer.explain_files([Path(r["file"]) for r in done], [r["topk"][0]["index"] for r in done],
                                        out_dir, names=names)
        for result, path in zip(done, paths):
            result["explain"] = str(path)
        yield from chunk


def _predict_texts(run: Optional[Path], texts: List[str], files: List[Path], device: str, as_json: bool) -> None:
    # start-up time: torch and tokenizers, as in predict()
    from inceptionlab.infer.text import TextPredictor, read_text_inputs
    from inceptionlab.runtime import resolve_device

    if run is None:
        raise UserError("--text needs --run RUN_DIR of a text model (e.g. one trained with imdb/text_classifier)")
    predictor = TextPredictor.from_run(run, resolve_device(device))
    for result in predictor.predict(read_text_inputs(texts, files)):
        if as_json:
            print(json.dumps(result))
        else:
            shown = result["text"] if len(result["text"]) <= 70 else result["text"][:67] + "..."
            print(f"{result['answer']:<8} P(positive)={result['probability']:.3f}  {shown}")


def _run_given_first(run: Optional[Path], model: Optional[str], inputs: list[Path]) -> tuple[Optional[Path], list[Path]]:
    """`predict RUN photos/` as `evaluate RUN` and `serve RUN` take it: a first input that is a run directory
    is the model when neither --run nor --model names one. A run directory anywhere else among the inputs
    is refused: classifying its plots is never what was meant."""
    from inceptionlab.checkpoint import RunDir  # torch: loaded when the command runs, never for --help

    if inputs and run is None and model is None and RunDir.is_run(inputs[0]):
        run, inputs = inputs[0], inputs[1:]
    for path in inputs:
        if RunDir.is_run(path):
            raise UserError(f"{path} is a run directory, not images to classify; give it as the model "
                            f"(--run {path}, or first: predict {path} IMAGES...) and the images after it")
    return run, inputs


def _left_out_notes(inputs: list[Path]) -> Iterator[str]:
    """What the folders among the inputs hold besides images (a phone's videos, sidecar files): named, as
    training and `data check` name them, not skipped without a word."""
    for folder in (path for path in inputs if path.is_dir()):
        yield from (f"{folder}: {note}" for note in left_out_notes(folder, non_images_under(folder), []))


def _format(result: dict) -> str:
    if "error" in result:
        return f"{result['file']}\n  error: {result['error']}"
    width = max(len(t["label"]) for t in result["topk"])
    lines = [result["file"]]
    if result.get("unknown"):
        lines.append(f"  unknown: the best guess scores {result['score']:.2%}, below the model's threshold")
    lines += [f"  {t['prob']:7.2%}  {t['label']:<{width}}  (class {t['index']})" for t in result["topk"]]
    if "explain" in result:
        lines.append(f"  Grad-CAM: {result['explain']}")
    return "\n".join(lines)


def register(root: typer.Typer) -> None:
    root.command("predict")(predict)



