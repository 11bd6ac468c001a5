"""Range-test curves as lists, for the suggestion rule's tests: the loss each step returned, in order.

BODY_BLOWN_UP is the whole-model test of a resnet18 from a weights file on three tiny-imagenet classes
(60 steps from 1e-7 to 10) as lr_find.json recorded its shape: the loss near chance (ln 3 = 1.10) until
~1e-3, a short fall, then a blow-up whose smoothed loss rose from 1.09 to ~3.7 without reaching 4x its
best, and a dip of a few steps inside the blown-up part (at 1.54) that the steepest-descent rule took
for the place to train at.
"""

from __future__ import annotations

BODY_BLOWN_UP_STEPS = (1e-7, 10.0, 60)
BODY_BLOWN_UP = [
    1.18, 1.04, 1.13, 1.10, 1.10, 1.11, 1.06, 1.11, 1.09, 1.21, 1.12, 1.10, 1.10, 1.09, 1.08, 1.10, 1.12, 1.10,
    1.14, 1.10, 1.11, 1.15, 1.12, 1.09, 1.10, 1.12, 1.16, 1.09, 1.07, 1.06, 0.95, 0.92, 0.91, 2.02, 2.42, 2.86,
    3.18, 3.71, 4.07, 4.47, 4.95, 5.38, 5.77, 6.17, 6.62, 7.04, 7.50, 7.90, 8.31, 8.75, 9.13, 9.53, 10.0, 0.82,
    0.79, 0.78, 0.81, 8.93, 9.02, 9.01,
]


def u_shaped(seed: int, steps: int = 100, noise: float = 0.02) -> list[float]:
    """A loss flat at first, falling through a drawn rate, then rising steeply: the usual shape."""
    import numpy as np

    rng = np.random.default_rng(seed)
    logs = np.linspace(-7, 1, steps)
    centre, width = rng.uniform(-5, -2), rng.uniform(0.3, 1.0)
    fall = 1.0 - np.tanh((logs - centre) / width)
    rise = np.exp(np.clip(logs - centre - rng.uniform(1.5, 3.0), None, 5))
    return list(1.0 + fall + rise + rng.normal(0, noise, steps))
