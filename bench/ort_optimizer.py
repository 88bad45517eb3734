"""onnxruntime's transformer optimizer on the MiniLM encoder: throughput, parity, dynamic axes.

It fuses the exported graph (Attention, SkipLayerNormalization, BiasGelu), quantizes it as the
export quantizes the plain one, and times both against the exported encoder files on one intra-op
thread, interleaved so that a busy machine slows every graph alike. It checks the fused graphs
against PyTorch and the plain graphs, over batch sizes, lengths and masks not right-padded.

The export does not use the optimizer: on one CPU thread the fused graphs were not faster
(docs/performance.md has the figures); the TensorRT ONNX parser cannot read the com.microsoft
fused operators; and the Q/DQ INT8 recipe (``export.minilm.quantize_qdq``) selects the attention
MatMuls that the fusion packs into Attention nodes. Run it pinned to one core::

    taskset -c 1 .venv/bin/python -m bench.ort_optimizer [--out DIR] [--reps N]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from export import bert, minilm, onnx_export, text_samples
from pipelines import embedding as spec
from pipelines import onnx_runner

PLAIN = {"fp32": minilm.DEFAULT_OUTPUT, "int8": minilm.DEFAULT_INT8_OUTPUT}  # as exported
SLICE_S = 0.2  # per timed run: short runs, finely interleaved, keep load swings out of ratios
MASK_FORMAT = 2  # the raw 2-D mask: a 1-D mask index is wrong for gaps and left padding


def optimize(src: Path, dst: Path) -> dict[str, int]:
    """Fuse ``src`` with the BERT optimizer into ``dst``; return the fused operators' counts."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.attention_mask_format = MASK_FORMAT
    config = spec.model_config()
    model = optimize_model(
        str(src),
        model_type="bert",
        num_heads=config["num_attention_heads"],
        hidden_size=config["hidden_size"],
        optimization_options=options,
        opt_level=0,  # fusions only: the session applies its own optimizations
    )
    model.save_model_to_file(str(dst))
    return {k: v for k, v in model.get_fused_operator_statistics().items() if v}


def quantize(fp32: Path, output: Path) -> None:
    """``export.minilm.quantize``'s settings, with the tensor type the contrib ops hide."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # ONNX shape inference cannot type the com.microsoft outputs: say they are float.
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    quantize_dynamic(
        fp32, output, per_channel=True, weight_type=QuantType.QInt8, extra_options=extra
    )


def embed(session, token_ids, batch: int | None) -> np.ndarray:
    """Embeddings in order: runs of ``batch`` padded to their longest, or ``encode_sorted``'s."""

    def encoder(ids, mask):
        return session.run([spec.EMBEDDING], {spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask})[0]

    if batch is None:
        return spec.encode_sorted(encoder, token_ids)[0]
    runs = [token_ids[i : i + batch] for i in range(0, len(token_ids), batch)]
    return np.concatenate([encoder(*spec.pad(r, max(map(len, r)))) for r in runs])


def parity(sessions: dict) -> None:
    """Min cosine / max |Δ| of each graph against PyTorch and, if fused, against its plain graph."""
    texts = minilm.parity_texts() + text_samples.mixed_texts(40, seed=1)
    ids = spec.encode(texts)[0]
    ref = minilm.reference_embeddings(bert.load_pretrained(), texts)  # padded to the bucket
    got = {k: embed(s, ids, None) for k, s in sessions.items()}  # padded to each run's longest
    print(f"\n## parity ({len(texts)} texts): min cosine / max abs diff\n")
    print("| graph | vs torch | vs plain |\n|---|---|---|")
    for k, e in got.items():
        cells = [onnx_export.compare(ref, e)]
        if k.endswith("-opt"):
            cells.append(onnx_export.compare(got[k.removesuffix("-opt")], e))
        text = " | ".join(f"{r.cosine_min:.7f} / {r.max_abs_diff:.2e}" for r in cells)
        print(f"| {k} | {text} |" + (" - |" if len(cells) == 1 else ""))


def dynamic_axes(plain, fused) -> None:
    """Every batch size and length runs; masks with a gap or left padding agree too."""
    rng = np.random.default_rng(0)
    masks = []
    for batch in (1, 3, 17, 64):
        for seq in (1, 2, 16, 77, 256):
            lengths = rng.integers(1, seq + 1, size=batch)
            lengths[0] = seq
            masks.append(np.arange(seq)[None] < lengths[:, None])
    holes = np.ones((2, 12), dtype=bool)
    holes[0, 4:6] = holes[1, :3] = False
    cosines = []
    for mask in [*masks, holes]:
        ids = rng.integers(1000, 30000, size=mask.shape)
        feeds = {spec.INPUT_IDS: ids, spec.ATTENTION_MASK: mask.astype(np.int64)}
        a, b = (s.run([spec.EMBEDDING], feeds)[0] for s in (plain, fused))
        assert b.shape == (len(mask), spec.HIDDEN_SIZE), b.shape
        cosines.append(onnx_export.compare(a, b).cosine_min)
    print(
        f"\ndynamic axes: batch 1-64 x length 1-256 ran; min cosine fp32-opt vs fp32 "
        f"{min(cosines[:-1]):.7f}; mask with a gap / left padding {cosines[-1]:.7f}"
    )


def rate(session, token_ids, batch: int | None, passes: int) -> float:
    """Texts per second over ``passes`` passes of the workload."""
    start = time.perf_counter()
    for _ in range(passes):
        embed(session, token_ids, batch)
    return passes * len(token_ids) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    """Optimize and quantize into ``--out``, check parity, print the throughput table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="for the graphs (default: a temporary folder)")
    parser.add_argument("--reps", type=int, default=7, help="interleaved timed rounds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the quantizer logs every tensor it skips
    with tempfile.TemporaryDirectory(prefix="ort_optimizer-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        print(f"onnxruntime {ort.__version__}; graphs in {out}")
        sessions = build(out)
        parity(sessions)
        dynamic_axes(sessions["fp32"], sessions["fp32-opt"])
        throughput(sessions, args.reps)


def build(out: Path) -> dict[str, ort.InferenceSession]:
    """Copy the exported graphs into ``out``, fuse and quantize there; a session per graph."""
    files = {k: out / f"{k}.onnx" for k in ("fp32", "int8", "fp32-opt", "int8-opt")}
    for prec, src in PLAIN.items():  # private copies: a concurrent export may rewrite them
        shutil.copyfile(src, files[prec])
    print("fused operators:", optimize(files["fp32"], files["fp32-opt"]))
    quantize(files["fp32-opt"], files["int8-opt"])
    return {k: onnx_runner.create_session(p, intra_op_threads=1) for k, p in files.items()}


def throughput(sessions: dict, reps: int) -> None:
    """Print texts/s of each graph per workload, and the optimized / plain ratios."""
    sentences = [text_samples.SENTENCES[i % len(text_samples.SENTENCES)] for i in range(96)]
    short = spec.encode(sentences)[0]
    workloads = {"short b1": (short[:48], 1), "short b8": (short, 8), "short b32": (short, 32)}
    workloads["mixed"] = (spec.encode(text_samples.mixed_texts(100))[0], None)
    passes = {}
    for w, (ids, batch) in workloads.items():
        for s in sessions.values():  # warm-up
            rate(s, ids, batch, 1)
        passes[w] = max(1, round(SLICE_S * rate(sessions["fp32"], ids, batch, 1) / len(ids)))
    results = {(w, k): [] for w in workloads for k in sessions}
    for _ in range(reps):
        for w, (ids, batch) in workloads.items():
            for k, s in sessions.items():  # every graph once per round, in turn
                results[(w, k)].append(rate(s, ids, batch, passes[w]))
    print(f"\n## texts/s, median of {reps} interleaved rounds, 1 intra-op thread")
    print("ratio: median over rounds of optimized / plain (same precision, same round)\n")
    print("| workload | fp32 | fp32-opt | ratio | int8 | int8-opt | ratio |")
    print("|---|---|---|---|---|---|---|")
    for w in workloads:
        cells = []
        for prec in PLAIN:
            plain, fused = results[(w, prec)], results[(w, f"{prec}-opt")]
            ratio = statistics.median(f / p for f, p in zip(fused, plain, strict=True))
            cells += [f"{statistics.median(plain):.1f}", f"{statistics.median(fused):.1f}"]
            cells.append(f"{ratio:.3f}")
        print(f"| {w} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
