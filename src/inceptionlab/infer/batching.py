"""The batch sizes a model is compiled and warmed at: powers of two up to the largest batch.

`inceptionlab serve` pads every batch up to the next of these sizes (so a model only ever runs them)
and runs each once before it reports ready; the Triton repository written by `export --format
triton` warms the same sizes. The first call at a new shape costs oneDNN kernel creation (and on
OpenVINO a static-shape compile): never a client's request.
"""

from __future__ import annotations


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to max_batch (max_batch itself always included)."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch]
