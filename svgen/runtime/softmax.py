"""The softmax's numbers every svgen kernel shares: the TPU forward and backward, the GPU forward."""

from __future__ import annotations

import numpy as np

LOG2_E = 1.4426950408889634
# Finite "minus infinity": exp2(MASK_VALUE - m) underflows to 0 without inf - inf = NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
# The log-sum-exp saved for the backward pass of a row with no allowed key: exp2(s - it) = 0
# for every score, so the row gets no probability and no gradient.
EMPTY_ROW_LSE = -MASK_VALUE
