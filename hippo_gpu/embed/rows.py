"""Row operations every embedding source shares: L2 normalisation and length buckets.

The lowest module of the embed package: encoder, onnx_backend and sources import it, it imports
none of them.
"""

from __future__ import annotations

import numpy as np
import torch


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows L2-normalised exactly as the torch path does it (torch.nn.functional.normalize).

    [n, D] -> [n, D] float32, e_i / max(||e_i||, 1e-12), so a zero row stays zero.
    """
    return torch.nn.functional.normalize(torch.from_numpy(x).float(), dim=-1).numpy()


def length_buckets(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Rows grouped into batches of similar length: [n] lengths -> row-index arrays.

    Rows are sorted by length (stable, so equal lengths keep their order) and cut into runs of
    at most `batch_size`; a batch padded to its own longest row then carries little padding.
    """
    order = np.argsort(lengths, kind="stable")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
