"""Raw strings in, an answer out: text runs for `predict --text`, and a self-contained export.

A text run answers by its decision rule (models/rule.py) as an image run does: the answer (its label,
or "unknown" below the rule's threshold), the calibrated score, and, for a binary run, P(positive).

The export (`RUN/exports/text/`) is `model.pt2` (torch.export) + `tokenizer.json` (HuggingFace
tokenizers) + `meta.json` (the class names and the rule) + `classify.py`: it loads with plain `torch`
and `tokenizers`, none of this package's code or training state, and answers by the rule in meta.json
(rewritten when `evaluate` saves a new rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.data.text.vectorizer import TextVectorizer
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json, atomic_write_text
from inceptionlab.models.registry import load_run_model
from inceptionlab.models.spec import ModelSpec

TEXT_EXPORT = Path("exports") / "text"  # in the run directory
CLASSIFY_SCRIPT = '''"""Classify texts with an exported inceptionlab text model: python classify.py "great film" ...

Needs only torch and tokenizers. Prints one JSON object per text: the answer (its label, or "unknown"
below the decision rule's threshold), the calibrated score, the top label and P(positive).
"""
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent


def load():
    tokenizer = Tokenizer.from_file(str(HERE / "tokenizer.json"))
    model = torch.export.load(str(HERE / "model.pt2")).module()
    return tokenizer, model


def probabilities(tokenizer, model, texts, temperature=1.0):
    """Calibrated P(positive) per text: sigmoid(logit / temperature), in float64."""
    ids = torch.tensor([e.ids for e in tokenizer.encode_batch(list(texts))], dtype=torch.long)
    with torch.no_grad():
        return torch.sigmoid(model(ids).reshape(-1).double() / temperature).tolist()


def answer(p, rule, class_names):
    """The decision rule's answer: the top class, or "unknown" where its probability is below the threshold."""
    label, score = class_names[int(p > 0.5)], max(p, 1.0 - p)
    unknown = rule["threshold"] is not None and score < rule["threshold"]
    return {"answer": "unknown" if unknown else label, "score": round(score, 6), "unknown": unknown,
            "label": label, "probability": round(p, 6)}


if __name__ == "__main__":
    meta = json.loads((HERE / "meta.json").read_text())
    rule = meta["rule"]
    tokenizer, model = load()
    for text, p in zip(sys.argv[1:], probabilities(tokenizer, model, sys.argv[1:], rule["temperature"])):
        print(json.dumps({"text": text, **answer(p, rule, meta["class_names"])}))
'''


class TextPredictor:
    """A trained text run: its model and the tokenizer saved beside it."""

    def __init__(self, model: nn.Module, spec: ModelSpec, vectorizer: TextVectorizer, device: torch.device):
        self.model, self.spec, self.vectorizer, self.device = model.to(device).eval(), spec, vectorizer, device
        self.rule = spec.rule  # as `evaluate` fitted it (T = 1, no threshold until then)

    @classmethod
    def from_run(cls, run_dir: Path, device: torch.device) -> "TextPredictor":
        model, spec = load_run_model(run_dir)
        if spec.input_kind != "tokens" or not spec.tokenizer:
            raise UserError(f"{run_dir}: this run classifies images, not text; pass image files instead of --text")
        return cls(model, spec, TextVectorizer.load(Path(run_dir) / spec.tokenizer), device)

    @torch.inference_mode()
    def predict(self, texts: list[str], batch_size: int = 256) -> Iterator[dict[str, Any]]:
        """{"text", "answer", "score", "unknown", "label", "probability"}: the rule's answer (the label, or
        "unknown"), its calibrated score, the top label, and P(positive) (class 1) for binary runs (else the
        top label's probability)."""
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            ids = self.vectorizer.encode(chunk).to(self.device)
            answers = self.rule.decide(self.model(ids).float().cpu())
            for i, text in enumerate(chunk):
                p, index = answers.probabilities[i], int(answers.index[i])
                yield {"text": text, **answers.row(i, self.spec.labels), "label": self.spec.labels[index],
                       "probability": round(float(p[-1] if len(p) == 2 else p[index]), 6)}


def export_text_model(run_dir: Path, model: nn.Module, spec: ModelSpec) -> Path:
    """RUN/exports/text/: model.pt2 + tokenizer.json + meta.json + classify.py (written atomically)."""
    run = RunDir(Path(run_dir))
    out = run.path / TEXT_EXPORT
    out.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(2, TextVectorizer.load(run.path / spec.tokenizer).seq_len, dtype=torch.long)
    program = torch.export.export(model.eval().cpu(), (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    tmp = out / ".model.tmp.pt2"  # torch.export.save wants the .pt2 suffix
    torch.export.save(program, str(tmp))
    tmp.replace(out / "model.pt2")
    atomic_write_text(out / "tokenizer.json", (run.path / spec.tokenizer).read_text())
    write_export_rule(out, spec)
    atomic_write_text(out / "classify.py", CLASSIFY_SCRIPT)
    return out


def write_export_rule(out: Path, spec: ModelSpec) -> None:
    """meta.json of a text export: the class names and the decision rule classify.py answers by."""
    atomic_write_json(out / "meta.json", {"class_names": spec.labels, "task": spec.task,
                                          "output": "one logit per text; sigmoid(logit / temperature) gives P(class 1)",
                                          "rule": spec.rule.to_dict()})


def refresh_text_export(run_dir: Path, spec: ModelSpec) -> Path | None:
    """A text run's export answers by the rule just saved (`evaluate`): its meta.json rewritten (the graph
    and tokenizer are the run's and unchanged). None when the run has no text export."""
    out = Path(run_dir) / TEXT_EXPORT
    if spec.input_kind != "tokens" or not (out / "meta.json").is_file():
        return None
    write_export_rule(out, spec)
    return out


def export_text_run(run_dir: Path) -> Path | None:
    """export_text_model for a finished run's model.pt; None for an image run (nothing to do)."""
    model, spec = load_run_model(run_dir)
    if spec.input_kind != "tokens":
        return None
    return export_text_model(run_dir, model, spec)


def read_text_inputs(texts: list[str], files: list[Path]) -> list[str]:
    """--text values, then every non-empty line of each --text-file."""
    out = list(texts)
    for path in files:
        try:
            out += [line for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        except OSError as exc:
            raise UserError(f"{path}: cannot read text file ({exc.strerror})") from None
    return out



