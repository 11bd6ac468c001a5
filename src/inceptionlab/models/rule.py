"""The decision rule as the model's spec carries it: calibrated probabilities and the "unknown" answer.

Fitted by `evaluate` (judge/calibrate.py, judge/decision.py) and applied here by predict, export
metadata and serve alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from inceptionlab.models.spec import ModelSpec

UNKNOWN = "unknown"  # the answer below the reject threshold


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    scaled = scaled - scaled.max(axis=1, keepdims=True)
    exp = np.exp(scaled)
    return exp / exp.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class Decision:
    """The spec's decision rule: calibrated probabilities and the "unknown" answer (predict, evaluate, serve)."""

    temperature: float = 1.0
    threshold: float | None = None

    @classmethod
    def of(cls, spec: ModelSpec) -> "Decision":
        return cls(spec.temperature, spec.reject_threshold)

    def scale(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits as the calibrated probabilities see them (the task's softmax/sigmoid comes after)."""
        return logits if self.temperature == 1.0 else logits.float() / self.temperature

    def unknown(self, top_probability: float) -> bool:
        return self.threshold is not None and top_probability < self.threshold

    def unknown_mask(self, top_probabilities: np.ndarray) -> np.ndarray:
        top = np.asarray(top_probabilities).reshape(-1)
        return np.zeros(len(top), bool) if self.threshold is None else top < self.threshold

    def answer(self, probabilities: Any, labels: list[str]) -> dict[str, Any]:
        """One image's answer from its calibrated probabilities: the top label or "unknown", the top
        probability as its score, and whether it fell below the threshold (predict --json, /v1/classify)."""
        row = np.asarray(probabilities, dtype=np.float64).reshape(-1)
        index = int(row.argmax())
        unknown = self.unknown(float(row[index]))
        return {"answer": UNKNOWN if unknown else labels[index], "score": round(float(row[index]), 6),
                "unknown": unknown}

    def describe(self) -> str:
        parts = [f"temperature {self.temperature:.4g}" if self.temperature != 1.0 else "uncalibrated (T = 1)"]
        if self.threshold is not None:
            parts.append(f"unknown below {self.threshold:.4f}")
        return ", ".join(parts)


def rule_parameters(spec: ModelSpec, tta: str | None = None) -> list[tuple[str, str]]:
    """The decision rule as configuration parameters (the server's model config, an exported Triton
    config): how `probabilities` are calibrated from `logits`, and when the answer is "unknown"."""
    rule = [("temperature", f"{spec.temperature:.9g}")]
    if tta is not None:
        rule.append(("tta", tta))
    if spec.reject_threshold is not None:
        rule += [("reject_threshold", f"{spec.reject_threshold:.9g}"), ("reject_target", spec.reject_target or "")]
    return rule
