"""Two figures every bench derives: a percentile of samples and a ratio, None where either is
undefined (no samples, no denominator)."""

from typing import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator
