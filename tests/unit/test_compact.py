"""pipelines.compact: a state dict's compact copy, read back as written or refused."""

from __future__ import annotations

import json
import re

import pytest
import torch

from export import minilm
from pipelines import bert, compact

SOURCE = "ab" * 32


def state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "big.weight": torch.randn(512, 256, generator=gen) * 0.05,  # 131k values: int8
        "small.weight": torch.randn(64, 64, generator=gen),  # 4k values: fp16
        "norm.bias": torch.randn(256, generator=gen),  # 1-D: fp16
        "norm.running": torch.randn(256, generator=gen).double(),  # fp32 by the rule below
        "steps": torch.tensor(7),  # not floating point: kept as it is
    }


def rule(name: str, tensor: torch.Tensor) -> str:
    return compact.FP32 if name == "norm.running" else compact.matrices(100_000)(name, tensor)


def test_a_round_trip_gives_each_tensor_back_within_its_forms_error(tmp_path):
    path = tmp_path / "w.safetensors"
    original = state()
    header = compact.pack(original, path, rule, SOURCE, extra={"config": {"hidden": 256}})
    assert header["forms"] == {
        "big.weight": "int8", "small.weight": "fp16", "norm.bias": "fp16",
        "norm.running": "fp32", "steps": "kept",
    }  # fmt: skip
    assert compact.read_header(path)["extra"] == {"config": {"hidden": 256}}
    back = compact.unpack(path, source_sha256=SOURCE)
    assert set(back) == set(original)
    for name in ("big.weight", "small.weight", "norm.bias", "norm.running"):
        assert back[name].dtype == torch.float32 and back[name].shape == original[name].shape
    # int8: each value within half a step of its group's scale (max |x| / 127, 64 values).
    groups = original["big.weight"].reshape(-1, compact.GROUP)
    step = (groups.abs().amax(1, keepdim=True) / 127).expand_as(groups).reshape(512, 256)
    error = (back["big.weight"] - original["big.weight"]).abs()
    assert (error <= step * 0.51).all() and error.max() > 0
    assert torch.equal(back["small.weight"], original["small.weight"].half().float())
    assert torch.equal(back["norm.running"], original["norm.running"].float())
    assert torch.equal(back["steps"], original["steps"])
    # Smaller than fp32: one byte per int8 value and two per fp16 one, plus the scales.
    assert path.stat().st_size < 0.4 * sum(t.numel() * 4 for t in original.values())


def test_an_all_zero_group_stays_zero():
    values, scale = compact.quantize(torch.zeros(2, 128))
    assert torch.equal(compact.dequantize(values, scale), torch.zeros(2, 128))


def test_the_rule_picks_int8_for_large_matrices_only():
    big = compact.matrices(100_000)
    assert big("w", torch.zeros(400, 256)) == compact.INT8
    assert big("w", torch.zeros(300, 256)) == compact.FP16  # 76,800 values
    assert big("w", torch.zeros(400 * 256)) == compact.FP16  # 1-D
    assert compact.matrices(10, otherwise=compact.FP32)("w", torch.zeros(3)) == compact.FP32
    # MiniLM's: every matrix but the token-type table is int8, nothing else is.
    forms = {n: minilm.COMPACT_RULE(n, t) for n, t in bert.safetensors_state().items()}
    int8 = {n for n, f in forms.items() if f == compact.INT8}
    assert "embeddings.token_type_embeddings.weight" not in int8
    assert {n for n in forms if n.endswith("dense.weight")} <= int8
    assert "embeddings.word_embeddings.weight" in int8
    assert all(n.endswith("weight") for n in int8) and len(int8) == 39


@pytest.mark.parametrize(
    ("bad_rule", "message"),
    [
        (lambda n, t: "int4", "the rule chose 'int4'"),
        (lambda n, t: compact.INT8, "norm.bias: int8 needs a last axis that is a multiple"),
    ],
)
def test_a_form_it_cannot_store_is_refused_by_name(tmp_path, bad_rule, message):
    tensors = {"norm.bias": torch.zeros(100)}
    with pytest.raises(ValueError, match=message):
        compact.pack(tensors, tmp_path / "w.safetensors", bad_rule, SOURCE)
    assert not (tmp_path / "w.safetensors").exists()


def test_a_damaged_copy_or_one_of_other_weights_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    compact.pack(state(), path, rule, SOURCE)
    with pytest.raises(compact.CompactError, match="not of " + "cd" * 32):
        compact.unpack(path, source_sha256="cd" * 32)
    data = bytearray(path.read_bytes())
    data[-1000] ^= 0x01  # one bit of the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(compact.CompactError, match="do not match its header's sha256"):
        compact.unpack(path)
    plain = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(plain), metadata={"other": json.dumps({})})
    with pytest.raises(compact.CompactError, match="without a compact header"):
        compact.unpack(plain)
    (tmp_path / "text.safetensors").write_text("not weights")
    with pytest.raises(compact.CompactError, match="not a safetensors file"):
        compact.read_header(tmp_path / "text.safetensors")


def test_minilm_s_copy_is_refused_and_not_written_below_the_floor(tmp_path, encoder_onnx):
    """int8 weights keep MiniLM within the export's floor (tests/integration/test_gpu_text.py
    writes one), but not within 0.99999: asked for that, the command writes nothing."""
    output = tmp_path / "minilm.safetensors"
    with pytest.raises(SystemExit, match=re.escape("compact weights refused: min cosine 0.99")):
        minilm.write_compact(output, encoder_onnx[0], min_cosine=0.99999)
    assert list(tmp_path.iterdir()) == []
