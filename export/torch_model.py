"""Any PyTorch model into the repository: ONNX with a dynamic batch axis, checked, then its files.

``python -m export torch --model pkg.module:factory --input NAME:DTYPE:DIMS --name MODEL``
imports the factory (a module class or a function that returns a module), runs it, and refuses
before anything is written what Triton would refuse or serve wrongly:

* a datatype Triton or the clients cannot carry (``export.tensor_specs``);
* a graph that is not batchable: outputs whose first axis is not the batch, rows that depend
  on the other rows of their batch (a batch statistic, a reshape across the batch), or a graph
  the export fixed to its example's batch size (it fails on onnxruntime at another);
* outputs onnxruntime computes differently from PyTorch (``atol + rtol·|expected|``), on
  generated inputs at batch 1, 3 and up to the largest batch, each dynamic axis at its smallest
  and largest, and on the user's own examples (``--example FILE.npz``).

Then ``export.model_files`` writes the model's folder (config, variants, signature).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

import model_config
from export import model_files, onnx_export, tensor_specs
from export.tensor_specs import InputSpec, SpecError
from paths import MODEL_REPOSITORY
from pipelines import onnx_runner
from pipelines.tensors import Signature, Tensor

log = logging.getLogger(__name__)

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
# Static INT8 moves each output row by a direction change of a few tenths of a degree on the
# models tried here (docs/your-model.md); below this cosine to PyTorch's fp32 row it is refused.
MIN_COSINE_INT8 = 0.99
CHECK_BATCHES = (1, 3)  # and min(max_batch, LARGEST_CHECKED_BATCH)
LARGEST_CHECKED_BATCH = 16
CALIBRATION_BATCHES = 8
SEED = 0


@dataclass(frozen=True)
class Request:
    """What the user asked for on the command line."""

    factory: str
    inputs: tuple[InputSpec, ...]
    name: str
    outputs: tuple[str, ...] = ()
    max_batch: int = 32
    int8: bool = False
    examples: tuple[Path, ...] = ()
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    opset: int = onnx_export.DEFAULT_OPSET
    # The command line that made it, kept in signature.json so `make models` can export again.
    command: tuple[str, ...] = ()


@dataclass
class Exported:
    """A model that passed every check: its signature and graphs, in a staging folder."""

    signature: Signature
    ranges: dict[str, dict[int, tuple[int, int, int]]]
    graphs: dict[str, Path]  # version → model.onnx
    report: dict = field(default_factory=dict)


def load_factory(reference: str) -> torch.nn.Module:
    """``package.module:attribute`` → the module it names or builds, in eval mode.

    Raises:
        SpecError: a malformed reference, an import that fails, or no ``torch.nn.Module``.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise SpecError(f"--model {reference!r}: expected package.module:factory")
    if "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current folder's packages import
    try:
        target = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"--model {reference!r}: {exc}") from exc
    model = target if isinstance(target, torch.nn.Module) else target()
    if not isinstance(model, torch.nn.Module):
        raise SpecError(
            f"--model {reference!r} gave a {type(model).__name__}, not a torch.nn.Module"
        )
    return model.eval()


class Positional(torch.nn.Module):
    """The user's module with tensors in and a tuple of tensors out, as ONNX export needs.

    Outputs may be a tensor, a tuple or list of tensors, or a mapping (a dict, Hugging Face's
    ``ModelOutput``): from a mapping, the keys ``keys`` names, else every tensor value in order.
    """

    def __init__(self, module: torch.nn.Module, keys: Sequence[str] = ()):
        super().__init__()
        self.module = module
        self.keys = tuple(keys)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The module's outputs, flattened to a tuple of tensors."""
        return flatten(self.module(*inputs), self.keys)


def flatten(out, keys: Sequence[str] = ()) -> tuple[torch.Tensor, ...]:
    """A module's result as a tuple of tensors; SpecError for anything else."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, Mapping):
        if keys and all(k in out for k in keys):
            out = [out[k] for k in keys]
        else:
            out = [v for v in out.values() if v is not None]
    if isinstance(out, tuple | list) and out and all(isinstance(t, torch.Tensor) for t in out):
        return tuple(out)
    raise SpecError(
        f"the model returned {type(out).__name__}: expected a tensor, a tuple or list of tensors, "
        "or a mapping of tensors"
    )


def output_keys(out) -> list[str]:
    """A mapping's tensor keys where a module returned one (output names by default), else []."""
    if isinstance(out, Mapping):
        return [k for k, v in out.items() if isinstance(v, torch.Tensor)]
    return []


def _inputs(
    specs: Sequence[InputSpec], batch: int, pick: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    return {s.tensor.name: s.generate(rng, s.shape(batch, pick)) for s in specs}


def _torch_run(model: torch.nn.Module, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with torch.inference_mode():
        out = model(*(torch.from_numpy(np.ascontiguousarray(a)) for a in feeds.values()))
    return [t.detach().cpu().numpy() for t in out]


def _run_or_refuse(model, feeds, what: str) -> list[np.ndarray]:
    try:
        return _torch_run(model, feeds)
    except SpecError:
        raise
    except Exception as exc:
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        raise SpecError(f"PyTorch fails {what} (inputs {shapes}): {exc}") from exc


def _worst(expected: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> tuple[float, bool]:
    """Largest |difference|, and whether every element is within ``atol + rtol·|expected|``."""
    if expected.shape != got.shape:
        return float("inf"), False
    if expected.dtype.kind in "biu":
        return float(np.abs(expected.astype(np.int64) - got.astype(np.int64)).max(initial=0)), bool(
            np.array_equal(expected, got)
        )
    e, g = expected.astype(np.float64), got.astype(np.float64)
    same_nan = np.isnan(e) == np.isnan(g)
    diff = np.where(np.isnan(e) | np.isnan(g), 0.0, np.abs(e - g))
    ok = bool(same_nan.all() and (diff <= atol + rtol * np.abs(np.nan_to_num(e))).all())
    return float(diff.max(initial=0.0)), ok


def probe(
    model: torch.nn.Module, request: Request, names: Sequence[str]
) -> tuple[list[Tensor], dict[str, dict[int, str]]]:
    """The outputs' tensors and dynamic axes, from runs at two batch sizes and every range end.

    Raises:
        SpecError: the model fails to run, is not batchable, or gives an unsupported datatype.
    """
    rng = np.random.default_rng(SEED)
    runs = {
        (batch, pick): _run_or_refuse(
            model, _inputs(request.inputs, batch, pick, rng), f"at batch {batch}"
        )
        for batch, pick in ((2, 1), (3, 0), (3, 2))
    }
    if len(runs[(2, 1)]) != len(names):
        raise SpecError(
            f"the model gives {len(runs[(2, 1)])} outputs, --output names {len(names)}: "
            f"{list(names)}"
        )
    tensors, dynamic = [], {}
    for index, name in enumerate(names):
        arrays = {key: out[index] for key, out in runs.items()}
        for (batch, _), array in arrays.items():
            if array.ndim == 0 or array.shape[0] != batch:
                raise SpecError(
                    f"not batchable: output {name} has shape {list(array.shape)} for a batch of "
                    f"{batch}; Triton batches along the first axis of every input and output"
                )
        try:
            kind = tensor_specs.datatype_of(arrays[(2, 1)].dtype)
        except SpecError as exc:
            raise SpecError(f"output {name}: {exc}") from None
        shapes = {a.shape[1:] for a in arrays.values()}
        if len({len(s) for s in shapes}) != 1:
            raise SpecError(f"output {name}: its rank changes with the inputs' sizes: {shapes}")
        dims = tuple(
            size if len({s[axis] for s in shapes}) == 1 else -1
            for axis, size in enumerate(arrays[(2, 1)].shape[1:])
        )
        tensors.append(Tensor(name, kind, dims))
        dynamic[name] = {0: "batch"} | {
            axis + 1: f"{name}_{axis + 1}" for axis, size in enumerate(dims) if size < 0
        }
    check_rows_independent(model, request, names)
    return tensors, dynamic


def check_rows_independent(model: torch.nn.Module, request: Request, names: Sequence[str]) -> None:
    """Refuse a model whose answer for one row depends on the other rows of its batch.

    Triton batches requests from different clients: each must get what it would get alone.
    """
    rng = np.random.default_rng(SEED + 1)
    feeds = _inputs(request.inputs, 3, 1, rng)
    together = _torch_run(model, feeds)
    for row in range(3):
        alone = _torch_run(model, {k: v[row : row + 1] for k, v in feeds.items()})
        for name, batch_out, single in zip(names, together, alone, strict=True):
            worst, ok = _worst(single, batch_out[row : row + 1], request.atol, request.rtol)
            if not ok:
                raise SpecError(
                    f"not batchable: output {name} of row {row} in a batch of 3 differs from the "
                    f"same input alone by {worst:.3g} (a batch statistic or an op across the "
                    "batch axis); clients batched together would change each other's answers"
                )


def read_examples(paths: Sequence[Path], specs: Sequence[InputSpec]) -> list[dict[str, np.ndarray]]:
    """The user's inputs: one ``.npz`` per batch, an array per input name with the batch axis.

    Raises:
        SpecError: a missing input, a wrong datatype, a shape the signature does not accept.
    """
    batches = []
    for path in paths:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        feeds = {}
        for spec in specs:
            name = spec.tensor.name
            if name not in arrays:
                raise SpecError(f"{path}: no array {name!r} (it has {sorted(arrays)})")
            array = arrays[name]
            if array.dtype != spec.dtype:
                raise SpecError(f"{path}: {name} is {array.dtype}, the input is {spec.dtype}")
            dims = spec.tensor.dims
            if array.ndim != len(dims) + 1 or not all(
                (want < 0 and spec.ranges[axis][0] <= have <= spec.ranges[axis][2]) or have == want
                for axis, (have, want) in enumerate(zip(array.shape[1:], dims, strict=True), 1)
            ):
                raise SpecError(
                    f"{path}: {name} has shape {list(array.shape)}, the input takes "
                    f"[batch, {', '.join(map(str, dims))}] within {spec.ranges}"
                )
            feeds[name] = array
        if len({a.shape[0] for a in feeds.values()}) != 1:
            raise SpecError(f"{path}: the arrays disagree on the batch size")
        batches.append(feeds)
    return batches


def check_cases(request: Request, examples: list[dict[str, np.ndarray]]):
    """Every input batch the parity check runs: generated ones, then the user's."""
    rng = np.random.default_rng(SEED + 2)
    largest = min(request.max_batch, LARGEST_CHECKED_BATCH)
    cases = []
    for batch in sorted({*CHECK_BATCHES, largest}):
        if batch > request.max_batch:
            continue
        for pick in (0, 2) if any(s.ranges for s in request.inputs) else (1,):
            cases.append((f"batch {batch}, generated", _inputs(request.inputs, batch, pick, rng)))
    cases += [(f"example {i + 1}", feeds) for i, feeds in enumerate(examples)]
    return cases


def check_parity(
    model: torch.nn.Module,
    graph: Path,
    outputs: Sequence[str],
    cases,
    atol: float,
    rtol: float,
) -> dict:
    """Onnxruntime against PyTorch on every case; SpecError at the first that differs."""
    session = onnx_runner.create_session(graph, intra_op_threads=2)
    worst = 0.0
    for label, feeds in cases:
        expected = _torch_run(model, feeds)
        try:
            got = onnx_runner.run(session, feeds, list(outputs))
        except Exception as exc:
            raise SpecError(
                f"the exported graph fails on onnxruntime at {label} "
                f"({ {k: list(v.shape) for k, v in feeds.items()} }): the export fixed a size "
                f"the model takes from its input (a Python int from .shape, a view to the "
                f"example's size?): {str(exc).splitlines()[0]}"
            ) from exc
        for name, e, g in zip(outputs, expected, got, strict=True):
            if e.shape != g.shape:
                raise SpecError(
                    f"output {name} has shape {list(g.shape)} on onnxruntime and "
                    f"{list(e.shape)} in PyTorch at {label}: the export fixed a size the model "
                    "takes from its input (a Python int from .shape, a view to the example's "
                    "size?)"
                )
            diff, ok = _worst(e, g, atol, rtol)
            if not ok:
                raise SpecError(
                    f"parity: output {name} differs from PyTorch by up to {diff:.3g} at {label} "
                    f"(tolerance {atol} + {rtol}·|expected|)"
                )
            worst = max(worst, diff)
    log.info(
        "parity: %d cases within %g + %g·|expected|; max |Δ| %.3g", len(cases), atol, rtol, worst
    )
    return {"cases": len(cases), "max_abs_diff": worst}


def min_row_cosine(expected: np.ndarray, got: np.ndarray) -> float:
    """The smallest cosine between matching rows (each flattened)."""
    e = expected.reshape(len(expected), -1).astype(np.float64)
    g = got.reshape(len(got), -1).astype(np.float64)
    norms = np.linalg.norm(e, axis=1) * np.linalg.norm(g, axis=1)
    return float(((e * g).sum(1) / np.where(norms == 0, 1, norms)).min())


def quantize_int8(
    fp32: Path, output: Path, model: torch.nn.Module, request: Request, cases, outputs
) -> dict:
    """Static INT8 in Q/DQ form (symmetric, what TensorRT takes; onnxruntime runs it too).

    Calibrated on generated batches and the user's examples; refused when a float output row's
    cosine to PyTorch's falls under MIN_COSINE_INT8.
    """
    rng = np.random.default_rng(SEED + 3)
    batches = [_inputs(request.inputs, 4, 1, rng) for _ in range(CALIBRATION_BATCHES)]
    batches += [feeds for label, feeds in cases if label.startswith("example")]
    # The ops with weights, where INT8 pays; quantizing every Add and Mul as well only adds
    # rounding (and Q/DQ pairs TensorRT must fuse away).
    onnx_export.quantize_qdq(fp32, output, batches, op_types=["Conv", "MatMul", "Gemm"])
    session = onnx_runner.create_session(output, intra_op_threads=2)
    lowest = 1.0
    for _, feeds in cases:
        expected = _torch_run(model, feeds)
        got = onnx_runner.run(session, feeds, list(outputs))
        for name, e, g in zip(outputs, expected, got, strict=True):
            if e.dtype.kind != "f":
                continue
            cosine = min_row_cosine(e, g)
            lowest = min(lowest, cosine)
            if cosine < MIN_COSINE_INT8:
                raise SpecError(
                    f"--int8: output {name}'s rows move to a cosine of {cosine:.4f} from PyTorch's "
                    f"(floor {MIN_COSINE_INT8}); this model loses too much in static INT8"
                )
    log.info("int8: min row cosine to PyTorch %.5f", lowest)
    return {"int8_min_cosine": lowest}


def export(request: Request, staging: Path) -> Exported:
    """Import, probe, export and check ``request``'s model; its graphs land in ``staging``.

    Raises:
        SpecError: anything that must be refused; ``staging`` then holds nothing of use.
    """
    if request.max_batch < 1:
        raise SpecError(
            "--max-batch must be >= 1: this command makes batching models (Triton's "
            "max_batch_size 0 means a model that takes no batch axis)"
        )
    names_in = [s.tensor.name for s in request.inputs]
    tensor_specs.check_unique([*names_in, *request.outputs])
    examples = read_examples(request.examples, request.inputs)
    user_model = load_factory(request.factory)
    rng = np.random.default_rng(SEED)
    example = tuple(torch.from_numpy(a) for a in _inputs(request.inputs, 2, 1, rng).values())
    try:
        with torch.inference_mode():
            first = user_model(*example)
    except Exception as exc:
        raise SpecError(f"PyTorch fails on the example inputs: {exc}") from exc
    keys = list(request.outputs) or output_keys(first)
    model = Positional(user_model, keys).eval()
    count = len(flatten(first, keys))
    names = keys or (["OUTPUT"] if count == 1 else [f"OUTPUT_{i}" for i in range(count)])
    for name in names:
        tensor_specs.check_name(name, "output")
    tensor_specs.check_unique([*names_in, *names])
    outputs, output_axes = probe(model, request, names)
    dynamic_axes = {
        s.tensor.name: {0: "batch"} | {a: f"{s.tensor.name}_{a}" for a in s.ranges}
        for s in request.inputs
    } | output_axes
    graph = staging / "1" / "model.onnx"
    graph.parent.mkdir(parents=True)
    onnx_export.export(model, example, graph, names_in, names, dynamic_axes, opset=request.opset)
    cases = check_cases(request, examples)
    report = check_parity(model, graph, names, cases, request.atol, request.rtol)
    graphs = {"1": graph}
    if request.int8:
        quantized = staging / "2" / "model.onnx"
        quantized.parent.mkdir(parents=True)
        report |= quantize_int8(graph, quantized, model, request, cases, names)
        graphs["2"] = quantized
    signature = Signature(tuple(s.tensor for s in request.inputs), tuple(outputs))
    ranges = {s.tensor.name: dict(s.ranges) for s in request.inputs if s.ranges}
    return Exported(signature, ranges, graphs, report)


def publish(staging: Path, target: Path, replace: bool) -> None:
    """Move the checked folder into place; a model already there is replaced only if asked."""
    if target.exists():
        if not replace:
            raise SpecError(f"{target} exists: choose another --name, or --replace it")
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), str(target))


def scratch(repository: Path) -> tempfile.TemporaryDirectory:
    """A staging folder beside the repository (same file system: the final move is a rename)."""
    repository.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=repository.parent, prefix=".export-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``torch`` subcommand's options."""
    parser.add_argument(
        "--model",
        dest="factory",
        required=True,
        help="package.module:factory (a module, class or function)",
    )
    parser.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="NAME:DTYPE:DIMS[:LOW..HIGH]",
        help="per item, without the batch axis; a dim is N, -1 (1..64) or MIN..MAX (dynamic); "
        "LOW..HIGH: an integer input's generated values. In forward's argument order",
    )
    parser.add_argument(
        "--output",
        action="append",
        default=[],
        metavar="NAME",
        help="output names in order (default: a mapping's keys, else OUTPUT or OUTPUT_<i>)",
    )
    parser.add_argument("--name", required=True, help="the model's name (its folder)")
    parser.add_argument("--max-batch", type=int, default=32, help="max_batch_size (default 32)")
    parser.add_argument("--int8", action="store_true", help="also version 2: static INT8 (Q/DQ)")
    parser.add_argument(
        "--example",
        action="append",
        default=[],
        type=Path,
        metavar="FILE.npz",
        help="a batch of your own inputs (an array per input name) for the parity check",
    )
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL)
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL)
    parser.add_argument("--opset", type=int, default=onnx_export.DEFAULT_OPSET)
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--replace", action="store_true", help="replace a model of that name")


# What signature.json keeps of the command line: not where it wrote, nor --replace.
_NOT_KEPT = {"--repository": 1, "--replace": 0}


def kept_command(argv: Sequence[str]) -> tuple[str, ...]:
    """The command line without the options that say where and whether to write."""
    kept, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        key = arg.split("=", 1)[0]
        if key in _NOT_KEPT:
            skip = _NOT_KEPT[key] if "=" not in arg else 0
            continue
        kept.append(arg)
    return tuple(kept)


def request_from(args: argparse.Namespace, argv: Sequence[str] = ()) -> Request:
    """The parsed options as a Request (SpecError for a bad --input)."""
    return Request(
        factory=args.factory,
        inputs=tuple(tensor_specs.parse_input(text) for text in args.input),
        name=args.name,
        outputs=tuple(args.output),
        max_batch=args.max_batch,
        int8=args.int8,
        examples=tuple(args.example),
        atol=args.atol,
        rtol=args.rtol,
        opset=args.opset,
        command=kept_command(argv),
    )


def main(request: Request, repository: Path, replace: bool = False) -> Path:
    """Export, check and publish ``request``'s model as ``repository/<name>``; its folder.

    Nothing is written to the repository unless every check passes: the folder is built and
    checked beside it, then moved into place, and its configs rendered.
    """
    target = repository / tensor_specs.check_name(request.name, "--name")
    if target.exists() and not replace:
        raise SpecError(f"{target} exists: choose another --name, or --replace it")
    with scratch(repository) as tmp:
        staging = Path(tmp) / request.name
        exported = export(request, staging)
        model_files.write(
            staging,
            request.name,
            exported.signature,
            exported.ranges,
            request.max_batch,
            sorted(exported.graphs),
            request.command,
            model_files.local_variants(repository),
        )
        found = model_files.problems(staging, exported.signature, exported.ranges)
        if found:
            raise RuntimeError("generated files fail their checks:\n" + "\n".join(found))
        publish(staging, target, replace)
    model_config.render_repository(repository, models=[request.name])
    log.info("wrote %s (%s)", target, exported.report)
    return target


def regenerate(repository: Path) -> list[Path]:
    """Export again every generated model whose graph is missing (a fresh clone: ``make models``).

    Only the graphs are written: the configs and signature.json are the user's files now. The
    checks run as at the first export; a model that no longer passes them is an error.
    """
    done = []
    for signature_path in sorted(repository.glob(f"*/{model_files.SIGNATURE}")):
        folder = signature_path.parent
        signature, _, data = model_files.read_signature(folder)
        if data.get("command", [])[:1] != ["torch"]:
            continue  # a step of a text service, or another exporter's (python -m export sentence)
        versions = ["1", "2"] if data.get("int8") else ["1"]
        if all((folder / v / "model.onnx").is_file() for v in versions):
            continue
        parser = argparse.ArgumentParser(prog="python -m export torch")
        add_arguments(parser)
        command = data["command"][1:]  # after the subcommand's name
        request = request_from(parser.parse_args(command), command)
        if request.name != folder.name:
            raise SpecError(
                f"{signature_path}: its command names {request.name}, not {folder.name}"
            )
        with scratch(repository) as tmp:
            exported = export(request, Path(tmp) / folder.name)
            if exported.signature != signature:
                raise SpecError(
                    f"{folder}: the model now has the signature {exported.signature}, "
                    f"signature.json says {signature}: export it again with --replace"
                )
            for version, graph in exported.graphs.items():
                os.replace(graph, folder / version / "model.onnx")
        log.info("exported %s again", folder)
        done.append(folder)
    return done
