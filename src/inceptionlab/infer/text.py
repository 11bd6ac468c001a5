"""Raw strings in, P(positive) out: text runs for `predict --text`, and a self-contained export.

The export (`RUN/exports/text/`) is `model.pt2` (torch.export) + `tokenizer.json` (HuggingFace
tokenizers) + `classify.py`: it loads with plain `torch` and `tokenizers`, none of this package's
code or training state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from inceptionlab.checkpoint import RunDir
from inceptionlab.data.text.vectorizer import TextVectorizer
from inceptionlab.engine.task import make_task
from inceptionlab.errors import UserError
from inceptionlab.fileio import atomic_write_json, atomic_write_text
from inceptionlab.models.rule import Decision
from inceptionlab.models.registry import load_run_model
from inceptionlab.models.spec import ModelSpec

CLASSIFY_SCRIPT = '''"""Classify texts with an exported inceptionlab text model: python classify.py "great film" ...

Needs only torch and tokenizers. Prints one JSON object per text with P(positive).
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


def probabilities(tokenizer, model, texts):
    ids = torch.tensor([e.ids for e in tokenizer.encode_batch(list(texts))], dtype=torch.long)
    with torch.no_grad():
        return torch.sigmoid(model(ids).reshape(-1)).tolist()


if __name__ == "__main__":
    meta = json.loads((HERE / "meta.json").read_text())
    tokenizer, model = load()
    for text, p in zip(sys.argv[1:], probabilities(tokenizer, model, sys.argv[1:])):
        print(json.dumps({"text": text, "label": meta["class_names"][int(p > 0.5)], "probability": round(p, 6)}))
'''


class TextPredictor:
    """A trained text run: its model and the tokenizer saved beside it."""

    def __init__(self, model: nn.Module, spec: ModelSpec, vectorizer: TextVectorizer, device: torch.device):
        self.model, self.spec, self.vectorizer, self.device = model.to(device).eval(), spec, vectorizer, device
        self.task = make_task(spec.task, spec.num_classes)
        self.decision = Decision.of(spec)  # the run's temperature, as `evaluate` fitted it (T = 1 until then)

    @classmethod
    def from_run(cls, run_dir: Path, device: torch.device) -> "TextPredictor":
        model, spec = load_run_model(run_dir)
        if spec.input_kind != "tokens" or not spec.tokenizer:
            raise UserError(f"{run_dir}: this run classifies images, not text; pass image files instead of --text")
        return cls(model, spec, TextVectorizer.load(Path(run_dir) / spec.tokenizer), device)

    @torch.inference_mode()
    def predict(self, texts: list[str], batch_size: int = 256) -> Iterator[dict[str, Any]]:
        """{"text", "label", "probability"}: probability is P(positive) (class 1) for binary runs."""
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            ids = self.vectorizer.encode(chunk).to(self.device)
            probs = self.task.probabilities(self.decision.scale(self.model(ids))).cpu()
            for text, p in zip(chunk, probs):
                index = int(p.argmax())
                yield {"text": text, "label": self.spec.labels[index], "probability": round(float(p[-1] if len(p) == 2 else p[index]), 6)}


def export_text_model(run_dir: Path, model: nn.Module, spec: ModelSpec) -> Path:
    """RUN/exports/text/: model.pt2 + tokenizer.json + meta.json + classify.py (written atomically)."""
    run = RunDir(Path(run_dir))
    out = run.path / "exports" / "text"
    out.mkdir(parents=True, exist_ok=True)
    example = torch.zeros(2, TextVectorizer.load(run.path / spec.tokenizer).seq_len, dtype=torch.long)
    program = torch.export.export(model.eval().cpu(), (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    tmp = out / ".model.tmp.pt2"  # torch.export.save wants the .pt2 suffix
    torch.export.save(program, str(tmp))
    tmp.replace(out / "model.pt2")
    atomic_write_text(out / "tokenizer.json", (run.path / spec.tokenizer).read_text())
    atomic_write_json(out / "meta.json", {"class_names": spec.labels, "task": spec.task,
                                          "output": "one logit per text; sigmoid gives P(class 1)"})
    atomic_write_text(out / "classify.py", CLASSIFY_SCRIPT)
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



