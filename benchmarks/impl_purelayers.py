"""purelayers: the workload's model as defined in ``workloads.py``, its params loaded by name."""

from __future__ import annotations

import numpy as np

from benchmarks.harness import JaxModel
from benchmarks.workloads import Workload
from purelayers import params as P


def build(w: Workload, flat: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> JaxModel:
    model = w.model()
    params = P.unflatten(dict(flat))
    return JaxModel(params, model.apply, x, y)


def build_bf16(w: Workload, flat: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> JaxModel:
    """Float32 params, bfloat16 compute, float32 logits (``purelayers.precision``)."""
    from purelayers.precision import mixed_precision

    m = build(w, flat, x, y)
    return JaxModel(m.params, mixed_precision(m.forward), x, y)
