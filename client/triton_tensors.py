"""The one helper the gRPC examples share: a numpy array as a named Triton input."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient


def tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t
