"""The text service on a GPU host: what its run packs, serves and measures.

Parts of the GPU diagnostic (tests/gpu_diag.py), which makes the bundle, serves
``--model-config-name=gpu-local`` from a repository of its own and calls these, with the
conventions of tests/gpu_check.py:

- ``pack(out)``, on a machine with this repository's venv: what the host lacks for ``embed``.
  The weights package (83 MB) does not travel; its compact copy does (``pipelines.compact``,
  checked against the fp32 ONNX encoder as it is written), with the package's tokenizer.json and
  ``reference.json``: the sample texts with the fp32 ONNX encoder's vectors of them, and the
  short and mixed-length texts the load sends. The bundle carries them in its archive
  (``gpu_check.data_dir``); ``text_dir`` finds them.
- ``add_models(repository, source, bundle_dir)``: ``embed`` and its step into that repository
  (``gpu_check.write_repository``'s layout), the step reading those files (``weights`` and
  ``tokenizer`` parameters), version 1 only and without its per-text cache, so that every
  measured text reaches the GPU (serve with ``cache_bytes=0`` for the same reason).
- ``in_process(bundle_dir, device, plan)``: the same torch encoder as served, in this process:
  texts/s of the step's work (tokenize, sort, encode) at the batch sizes served runs form, and
  the cosine of its FP16 vectors to the fp32 reference.
- ``served(grpc_url, http_url, out_dir, plan, deadline)``: perf_analyzer (``--async``, gRPC) on
  ``embed`` at each concurrency of the plan, short and mixed texts, with the batches
  ``tokenize_encode`` formed meanwhile; and the served answers' cosine to the reference (the
  one beside the tokenizer file the served step reads).

``Plan.smoke()`` runs all of it on a CPU in seconds: packed and in process in
tests/integration/test_gpu_text.py, served in the diagnostic's rehearsal (test_gpu_diag.py).
Without a bundle the step reads the package and the reference is computed here. Only the
standard library is imported at module level: on the GPU host the rest comes from the bundle.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpu_text")

REPO = Path(__file__).resolve().parents[1]

COMPACT = "minilm.safetensors"
TOKENIZER = "tokenizer.json"
REFERENCE = "reference.json"
# Texts the load sends, each set: with every cache off, repeats cost the same as new texts.
LOAD_TEXTS = 1024
STEPS = ("embed", "tokenize_encode")


@dataclass
class Plan:
    """What one run measures; ``smoke`` shrinks it to seconds on a CPU."""

    batches: tuple[int, ...] = (64, 256)  # in process: texts per step call
    levels: tuple[int, ...] = (64, 256)  # served: perf_analyzer concurrency
    seconds: float = 2.0  # in process, per batch size and text set
    measurement_ms: int = 3000
    stability_percent: float = 20.0
    perf_extra: tuple[str, ...] = ()

    @classmethod
    def smoke(cls) -> Plan:
        """Seconds on a CPU: proves the script, measures nothing worth reporting."""
        counted = ("--measurement-mode=count_windows", "--measurement-request-count=10")
        return cls((4,), (2,), 0.2, 1000, 1000.0, counted)


def text_dir(bundle_dir: Path | None) -> Path | None:
    """Where ``pack`` put the files: ``bundle_dir`` itself, or the unpacked bundle's data."""
    if bundle_dir is None or (bundle_dir / COMPACT).exists():
        return bundle_dir
    from tests import gpu_check

    return gpu_check.data_dir(bundle_dir) / gpu_check.TEXT


def _files(bundle_dir: Path | None) -> tuple[str | None, str | None]:
    """(weights, tokenizer) paths for the step's parameters; None, None: the package."""
    folder = text_dir(bundle_dir)
    if folder is None:
        return None, None
    return str((folder / COMPACT).resolve()), str((folder / TOKENIZER).resolve())


@functools.cache
def make_reference() -> dict:
    """The sample texts with the fp32 ONNX encoder's vectors, and the load's two text sets.

    Made once per process (read, never changed): the diagnosis wants it twice.
    """
    from bench.harness import inputs
    from export import minilm, text_samples

    texts = minilm.compact_texts()
    vectors = minilm.onnx_embeddings(REPO / minilm.DEFAULT_OUTPUT, texts)
    return {
        "texts": texts,
        "vectors": vectors.tolist(),
        "short": text_samples.sentences(LOAD_TEXTS, seed=1),
        "mixed": inputs.mixed_texts()[:LOAD_TEXTS],
    }


def reference(bundle_dir: Path | None) -> dict:
    """The bundle's reference.json, or one made here (``make_reference``) without a bundle."""
    folder = text_dir(bundle_dir)
    if folder is None:
        return make_reference()
    return json.loads((folder / REFERENCE).read_text())


def served_reference(http_url: str) -> dict:
    """The reference packed with the tokenizer file the served step reads, else one made here."""
    import tritonclient.http as http

    from pipelines import embedding

    with http.InferenceServerClient(http_url) as client:
        parameters = client.get_model_config(embedding.TOKENIZE_ENCODE)["parameters"]
    tokenizer = parameters.get("tokenizer", {}).get("string_value")
    return reference(Path(tokenizer).parent if tokenizer else None)


def pack(out: Path) -> dict[str, int]:
    """Write the compact weights (checked), tokenizer.json and reference.json into ``out``.

    Returns:
        Each file's name and size in bytes.

    Raises:
        SystemExit: the compact weights fall below their floor (``export.minilm``).
    """
    from export import minilm
    from pipelines import minilm_weights

    out.mkdir(parents=True, exist_ok=True)
    minilm.write_compact(out / COMPACT, REPO / minilm.DEFAULT_OUTPUT)
    (out / TOKENIZER).write_bytes(minilm_weights.read_member("tokenizer.json"))
    (out / REFERENCE).write_text(json.dumps(make_reference()))
    return {name: (out / name).stat().st_size for name in (COMPACT, TOKENIZER, REFERENCE)}


def add_models(
    repository: Path, source: Path, bundle_dir: Path | None, text_cache: bool = False
) -> list[str]:
    """Write ``embed`` and ``tokenize_encode`` into ``repository`` (see the module).

    Args:
        repository: a repository of gpu_check.write_repository's layout.
        source: the checkout's model repository.
        bundle_dir: the bundle (None: the step reads the package).
        text_cache: keep the step's per-text cache (measured texts repeat: off by default).

    Returns:
        The models written.
    """
    import model_config
    from pipelines import embedding
    from tests import gpu_check

    models = (embedding.ENSEMBLE, embedding.TOKENIZE_ENCODE)
    configs = {
        name: (source / name, model_config.resolve(source / name, "gpu-local")) for name in models
    }
    step = configs[embedding.TOKENIZE_ENCODE][1]
    step.version_policy.specific.versions[:] = [1]  # embed's; embed_int8 is not measured
    weights, tokenizer = _files(bundle_dir)
    if weights is not None:
        step.parameters["weights"].string_value = weights
        step.parameters["tokenizer"].string_value = tokenizer
    if not text_cache:
        step.parameters["text_cache_bytes"].string_value = "0"
    gpu_check.write_repository(repository, configs, None)
    return list(models)


def _cosines(a, b):
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def in_process(bundle_dir: Path | None, device: str, plan: Plan) -> dict:
    """The step's work on the served torch encoder in this process (see the module)."""
    import model_config
    from bench.harness.raw import throughput
    from paths import MODEL_REPOSITORY
    from pipelines import embedding, padding, tokenization
    from pipelines.backend import torch_encoder

    ref = reference(bundle_dir)
    weights, tokenizer_file = _files(bundle_dir)
    step = model_config.resolve(MODEL_REPOSITORY / embedding.TOKENIZE_ENCODE, "gpu-local")
    params = {key: value.string_value for key, value in step.parameters.items()}
    max_tokens, run_cost = int(params["max_batch_tokens"]), int(params["run_cost_tokens"])
    started = time.monotonic()
    engine = torch_encoder.open_encoder(
        Path(weights) if weights else None,
        device,
        step.max_batch_size,
        max_tokens,
        # As served; on a GPU left alone: it would bind this whole process's CPU work.
        int(params.get("intra_op_thread_count", "0")) if device == "cpu" else 0,
    )
    tok = tokenization.tokenizer(tokenizer_file)

    def step_work(texts: list[str]):
        # What one execute of the step does with its texts: tokenize, sort, encode.
        tokens, _ = tokenization.encode_counted(texts, tok)
        return padding.encode_sorted(
            lambda ids, mask: engine({embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask})[0],
            tokens,
            max_tokens,
            run_cost,
        )[0]

    result = {
        "device": device,
        "numerics": engine.numerics,
        "open_s": round(time.monotonic() - started, 2),
        "cosine_min": float(_cosines(step_work(ref["texts"]), ref["vectors"]).min()),
        "texts_per_s": {},
    }
    for name in ("short", "mixed"):
        for batch in plan.batches:
            texts = [ref[name][i % len(ref[name])] for i in range(batch)]
            rate = throughput(lambda t=texts: step_work(t), batch, plan.seconds)
            result["texts_per_s"][f"{name} {batch}"] = round(rate, 1)
            log.info("in process, %s texts, batch %d: %.0f texts/s", name, batch, rate)
    return result


def served(
    grpc_url: str,
    http_url: str,
    out_dir: Path,
    plan: Plan,
    deadline: float,
    bundle_dir: Path | None = None,
) -> dict:
    """perf_analyzer on the served ``embed`` and its answers' cosine (see the module).

    A level that fails is a note; none starts after ``deadline`` (``time.monotonic()``). The
    reference is ``bundle_dir``'s where given, else the served step's (``served_reference``).
    """
    import tritonclient.grpc as grpcclient

    from bench.harness import inputs, perf_analyzer, stats
    from client.embed import EmbedClient
    from pipelines import embedding

    ref = reference(bundle_dir) if bundle_dir is not None else served_reference(http_url)
    result = {"cosine_min": None, "levels": [], "notes": []}
    with EmbedClient(http_url, "http") as client:
        vectors = client.embed(ref["texts"], truncate=True)
    result["cosine_min"] = float(_cosines(vectors, ref["vectors"]).min())
    out_dir.mkdir(parents=True, exist_ok=True)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    for name in ("short", "mixed"):
        data = out_dir / f"embed-{name}.json"
        data.write_text(json.dumps({"data": inputs.text_entries(ref[name])}))
        for level in plan.levels:
            left = deadline - time.monotonic()
            if left <= 0:
                result["notes"].append(f"{name} texts, concurrency {level}: not run, time spent")
                continue
            run = perf_analyzer.Run(
                model=embedding.ENSEMBLE, url=grpc_url, protocol="grpc", levels=(level,),
                input_data=data, measurement_ms=plan.measurement_ms,
                stability_percent=plan.stability_percent, extra=["--async", *plan.perf_extra],
            )  # fmt: skip
            before = stats.snapshot(grpc, STEPS, as_json=True)
            try:
                point = perf_analyzer.measure(run, level, timeout=min(120.0, max(left, 10.0)))
            except perf_analyzer.PerfAnalyzerError as exc:
                last = str(exc).splitlines()[-1]
                result["notes"].append(f"{name} texts, concurrency {level}: {last}")
                continue
            delta = stats.delta(before, stats.snapshot(grpc, STEPS, as_json=True))
            step, ensemble = delta[embedding.TOKENIZE_ENCODE], delta[embedding.ENSEMBLE]
            result["levels"].append(
                {
                    "texts": name,
                    "concurrency": level,
                    "texts_per_s": round(point.throughput, 1),
                    "p99_ms": round(point.p99_ms, 2),
                    "avg_batch": round(step.avg_batch, 2),
                    "batch_histogram": step.batch_histogram,
                    "queue_ms": round(step.queue_ms, 3),
                    "compute_ms": round(step.compute_ms, 3),
                    "cache_hits": ensemble.cache_hits,
                }
            )
            log.info(
                "served, %s texts, concurrency %d: %.0f texts/s", name, level, point.throughput
            )
    return result
