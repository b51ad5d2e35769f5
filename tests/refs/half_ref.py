"""A reference for sums of 16-bit floats over ranks, written apart from the engine: gloo's ring, element by
element, for buffers whose segments stay under 1 MiB (2t segments, so chunks of 2 * ceil(n / 2t) elements)."""
import math

import numpy as np


def ring_reference(xs: np.ndarray) -> np.ndarray:
    """xs[r] is rank r's flat buffer (ranks in ascending order, as torch orders a group). Element e of chunk c
    (c = e // chunk) is x[c] + (x[c+1] + (... + (x[c-2] + x[c-1]))), indices mod t, each addition done in
    float32 and rounded to the dtype, as gloo's ring adds and as bfloat16 and float16 arithmetic round."""
    t, n = xs.shape
    chunk = 2 * math.ceil(n / (2 * t))
    out = np.empty(n, dtype=xs.dtype)
    for e in range(n):
        c = e // chunk
        acc = xs[(c - 1) % t, e]
        for k in range(2, t + 1):
            acc = (np.float32(xs[(c - k) % t, e]) + np.float32(acc)).astype(xs.dtype)
        out[e] = acc
    return out
