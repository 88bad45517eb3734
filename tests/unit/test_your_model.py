"""``python -m export torch``: what it parses, what it refuses (writing nothing), what it writes.

The models come from tests/user_models; tests/integration/test_your_model.py serves them.
"""

from __future__ import annotations

import numpy as np
import pytest

import model_config
from export import model_files, tensor_specs, torch_model
from export.tensor_specs import SpecError
from export.tensorrt import profiles
from model_config import signatures

TOKENS = (
    tensor_specs.parse_input("tokens:int64:2..24:0..50"),
    tensor_specs.parse_input("scale:fp32:1"),
)


def request(factory: str, inputs=TOKENS, name: str = "mine", **more) -> torch_model.Request:
    return torch_model.Request(f"tests.user_models:{factory}", tuple(inputs), name, **more)


@pytest.mark.parametrize(
    "text, dims, ranges, values",
    [
        ("PIXELS:fp32:3,224,224", (3, 224, 224), {}, (0, 10)),
        ("ids:int64:1..128:0..30522", (-1,), {1: (1, 128, 128)}, (0, 30522)),
        ("ids:INT64:-1", (-1,), {1: tensor_specs.DEFAULT_RANGE}, (0, 10)),
        ("x:float32:4,2..8..16", (4, -1), {2: (2, 8, 16)}, (0, 10)),
    ],
)
def test_an_input_is_parsed(text, dims, ranges, values):
    spec = tensor_specs.parse_input(text)
    assert (spec.tensor.dims, spec.ranges, spec.values) == (dims, ranges, values)
    assert spec.tensor.datatype in tensor_specs.DATATYPES


@pytest.mark.parametrize(
    "text, message",
    [
        ("x:bf16:4", "bfloat16"),
        ("x:bytes:1", "strings"),
        ("x:complex64:1", "complex"),
        ("x:fp32", "NAME:DTYPE:DIMS"),
        ("x:fp32:0", ">= 1"),
        ("x:fp32:8..2", "MIN <= MAX"),
        ("x:fp32:4:0..3", "integer inputs only"),
        ("x y:fp32:4", "letters"),
        ("x:int64:4:5..5", "LOW < HIGH"),
    ],
)
def test_a_bad_input_is_refused_with_the_reason(text, message):
    with pytest.raises(SpecError, match=message):
        tensor_specs.parse_input(text)


@pytest.mark.parametrize(
    "factory, inputs, more, message",
    [
        ("CentersTheBatch", ["x:fp32:4"], {}, "not batchable: .* differs from the same input"),
        ("BakesTheBatch", ["x:fp32:4"], {}, "export fixed a size"),
        ("ReturnsText", ["x:fp32:4"], {}, "no complex datatype"),
        ("TokensAndScale", None, {"max_batch": 0}, "max-batch must be >= 1"),
        ("TokensAndScale", None, {"outputs": ("one",)}, "2 outputs, --output names 1"),
        ("TokensAndScale", None, {"outputs": ("tokens", "x")}, "used twice"),
        ("nothing_here", ["x:fp32:4"], {}, "no attribute"),
    ],
)
def test_what_triton_would_refuse_is_refused_before_anything_is_written(
    tmp_path, factory, inputs, more, message
):
    repository = tmp_path / "repository"
    specs = TOKENS if inputs is None else [tensor_specs.parse_input(t) for t in inputs]
    with pytest.raises(SpecError, match=message):
        torch_model.main(request(factory, specs, **more), repository)
    assert list(repository.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir()] == ["repository"]  # no staging left behind


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    repository = tmp_path_factory.mktemp("generated") / "repository"
    command = ("torch", "--model", "tests.user_models:TokensAndScale", "--input",
               "tokens:int64:2..24:0..50", "--input", "scale:fp32:1", "--name", "mine")  # fmt: skip
    torch_model.main(request("TokensAndScale", command=command), repository)
    return repository


def test_the_folder_passes_every_check_of_the_repository(exported):
    folder = exported / "mine"
    assert signatures.check_repository(exported) == []
    assert model_config.stale(exported) == []
    signature, ranges, _ = model_files.read_signature(folder)
    assert model_files.problems(folder, signature, ranges) == []
    assert [t.name for t in signature.outputs] == ["pooled", "per_token"]  # the dict's keys
    assert signature.output("per_token").dims == (-1,)  # follows the token axis
    assert (folder / "configs" / "gpu-local.overlay.pbtxt").is_symlink()
    assert model_config.render(folder, "local").backend == "python"


def test_its_tensorrt_engine_is_planned_from_signature_json(exported):
    (recipe,) = profiles.generated_recipes(exported)
    assert (recipe.model, recipe.version, recipe.precision) == ("mine", "1", "fp16")
    first, last = recipe.profiles(exported)
    assert first["tokens"].min == (1, 2) and last["tokens"].max == (32, 24)


def test_a_name_in_use_is_refused_unless_replaced(exported):
    with pytest.raises(SpecError, match="exists"):
        torch_model.main(request("TokensAndScale"), exported)


def test_a_missing_graph_is_exported_again_and_the_users_files_are_kept(exported):
    folder = exported / "mine"
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + "# the user's own line\n")
    graph = folder / "1" / "model.onnx"
    before = graph.read_bytes()
    graph.unlink()
    assert torch_model.regenerate(exported) == [folder]
    assert graph.read_bytes() == before  # the same export, byte for byte
    assert config.read_text().endswith("# the user's own line\n")
    assert torch_model.regenerate(exported) == []  # nothing missing: nothing done


def test_the_command_kept_says_neither_where_nor_whether_to_write():
    argv = ["torch", "--model", "m:f", "--repository", "/tmp/r", "--replace", "--name", "n"]
    assert torch_model.kept_command(argv) == ("torch", "--model", "m:f", "--name", "n")
    assert torch_model.kept_command(["--repository=/x", "--name", "n"]) == ("--name", "n")


def test_a_users_example_of_the_wrong_type_is_refused(tmp_path):
    path = tmp_path / "example.npz"
    np.savez(path, tokens=np.zeros((2, 4), np.int32), scale=np.ones((2, 1), np.float32))
    with pytest.raises(SpecError, match="tokens is int32, the input is int64"):
        torch_model.read_examples([path], TOKENS)
    np.savez(path, tokens=np.zeros((2, 40), np.int64), scale=np.ones((2, 1), np.float32))
    with pytest.raises(SpecError, match="has shape"):
        torch_model.read_examples([path], TOKENS)


def test_the_users_own_examples_are_checked_too(tmp_path):
    path = tmp_path / "example.npz"
    rng = np.random.default_rng(4)
    np.savez(
        path,
        tokens=rng.integers(0, 50, (5, 7)).astype(np.int64),
        scale=rng.standard_normal((5, 1)).astype(np.float32),
    )
    exported = torch_model.export(request("TokensAndScale", examples=(path,)), tmp_path / "staging")
    generated = len(torch_model.check_cases(request("TokensAndScale"), []))
    assert exported.report["cases"] == generated + 1
