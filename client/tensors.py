"""Client of any model by name: numpy arrays in, numpy arrays out, names read from the server.

For the models ``python -m export torch`` adds (docs/your-model.md), or any other: the model's
metadata says its inputs, their datatypes and its outputs, so nothing is written per model.

Example:
    with TensorClient("localhost:8001", protocol="grpc", model="mynet") as client:
        outputs = client.infer({"PIXELS": np.zeros((2, 3, 224, 224), np.float32)})
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from client import connection


class TensorClient(connection.ModelClient):
    """Synchronous client of one model whose inputs and outputs are plain tensors.

    ``version="1"`` asks for one version of the model (default: the newest it serves).
    """

    def metadata(self) -> dict:
        """The model's metadata as a dict (inputs, outputs, versions), either protocol."""
        try:
            if connection.is_http(self.mod):
                return self._client.get_model_metadata(self.model, self.version)
            return self._client.get_model_metadata(self.model, self.version, as_json=True)
        except Exception as exc:  # noqa: BLE001 - tritonclient's errors differ per protocol
            raise connection.infer_error(self.model, exc) from None

    def infer_arrays(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One request holding ``arrays`` (each with the batch axis); every output, by name.

        Raises:
            connection.ClientError: an input the model lacks or misses, or Triton's refusal.
        """
        meta = self.metadata()
        wanted = {t["name"] for t in meta["inputs"]}
        unknown = set(arrays) - wanted
        if unknown:
            raise connection.ClientError(
                f"{self.model} has no input {sorted(unknown)}; its inputs: {sorted(wanted)}"
            )
        inputs = [
            connection.make_input(
                self.mod, name, np.ascontiguousarray(a), np_to_triton_dtype(a.dtype)
            )
            for name, a in arrays.items()
        ]
        names = [t["name"] for t in meta["outputs"]]
        result = self.infer(inputs, connection.make_outputs(self.mod, names))
        return {name: result.as_numpy(name) for name in names}


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (one per input name) or a ``.npy`` (the model's one input).

    A ``.npy`` comes back under the key ``""``: ``with_input_names`` names it.
    """
    try:
        if path.suffix == ".npy":
            return {"": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise connection.ClientError(f"cannot read {path}: {exc}") from None


def with_input_names(arrays: dict[str, np.ndarray], metadata: dict) -> dict[str, np.ndarray]:
    """A lone unnamed array (a ``.npy``) named after the model's only input."""
    if list(arrays) != [""]:
        return arrays
    names = [t["name"] for t in metadata["inputs"]]
    if len(names) != 1:
        raise connection.ClientError(
            f"a .npy holds one array; the model takes {names}: give an .npz with those names"
        )
    return {names[0]: arrays[""]}
