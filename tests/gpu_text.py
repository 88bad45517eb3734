"""The text service on a GPU host: what its run packs, loads, measures in process and serves.

Parts of the GPU diagnostic, which makes the bundle, starts the server with
``--model-config-name=gpu-local`` and calls these (the conventions of tests/gpu_check.py):

- ``pack(out)``, on a machine with this repository's venv: what the host lacks for ``embed``.
  The weights package (83 MB) does not travel; its compact copy does (``pipelines.compact``,
  checked against the fp32 ONNX encoder as it is written), with the package's tokenizer.json and
  ``reference.json``: the sample texts with the fp32 ONNX encoder's vectors of them, and the
  short and mixed-length texts the load sends.
- ``load(server, bundle_dir)``: ``embed`` on a server started with explicit model control and
  nothing of it loaded, its ``tokenize_encode`` reading those files (``weights`` and
  ``tokenizer`` parameters), version 1 only, and without its per-text cache, so that every
  measured text reaches the GPU (start the server with ``cache_bytes=0`` for the same reason;
  the classifier may be loaded already).
- ``in_process(bundle_dir, device, plan)``: the same torch encoder as served, in this process:
  texts/s of the step's work (tokenize, sort, encode) at the batch sizes served runs form, and
  the cosine of its FP16 vectors to the fp32 reference.
- ``served(grpc_url, http_url, out_dir, plan, deadline, bundle_dir)``: perf_analyzer (``--async``,
  gRPC) on ``embed`` at each concurrency of the plan, short and mixed texts, with the batches
  ``tokenize_encode`` formed meanwhile; and the served answers' cosine to the reference.

``Plan.smoke()`` runs all of it on a CPU in seconds (tests/integration/test_gpu_text.py). A
``bundle_dir`` of None reads the package and computes the reference here instead. Only the
standard library is imported at module level: on the GPU host the rest comes from the bundle.
"""

from __future__ import annotations

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


def _files(bundle_dir: Path | None) -> tuple[str | None, str | None]:
    """(weights, tokenizer) paths for the step's parameters; None, None: the package."""
    if bundle_dir is None:
        return None, None
    return str((bundle_dir / COMPACT).resolve()), str((bundle_dir / TOKENIZER).resolve())


def make_reference() -> dict:
    """The sample texts with the fp32 ONNX encoder's vectors, and the load's two text sets."""
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
    if bundle_dir is None:
        return make_reference()
    return json.loads((bundle_dir / REFERENCE).read_text())


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


def load(server, bundle_dir: Path | None = None, text_cache: bool = False) -> None:
    """Load ``embed`` on ``server``, its step reading the bundle's files (see the module).

    The step's config is written into the server's own copy of the repository (the launcher
    makes one for GPU configs) before anything of ``embed`` loads, not sent as an override:
    loading the ensemble would reload the step from its folder, whose ``__pycache__`` the
    first load wrote, and a reload is what 2.51 does not always survive (docs/triton-2.51.md).

    Raises:
        ValueError: the server serves the checkout itself, which this must not write.
    """
    import tritonclient.http as http
    from google.protobuf import text_format

    import model_config
    from paths import MODEL_REPOSITORY
    from pipelines import embedding

    if server.repository.resolve() == MODEL_REPOSITORY.resolve():
        raise ValueError(f"{server.repository} is the checkout: serve the GPU configs")
    name = server.config.model_config_name
    path = server.repository / embedding.TOKENIZE_ENCODE / "configs" / f"{name}.pbtxt"
    config = model_config.parse(path)
    config.version_policy.specific.versions[:] = [1]  # embed's; embed_int8 is not measured
    weights, tokenizer = _files(bundle_dir)
    if weights is not None:
        config.parameters["weights"].string_value = weights
        config.parameters["tokenizer"].string_value = tokenizer
    if not text_cache:
        config.parameters["text_cache_bytes"].string_value = "0"
    path.unlink()  # a link into the checkout, or the launcher's file: replaced, not written through
    path.write_text(f"# Written by tests/gpu_text.py.\n{text_format.MessageToString(config)}")
    with http.InferenceServerClient(server.http_url) as client:
        client.load_model(embedding.ENSEMBLE, headers=server.admin_headers())


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
        int(params.get("intra_op_thread_count", "0")),
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

    A level that fails is a note; none starts after ``deadline`` (``time.monotonic()``).
    """
    import tritonclient.grpc as grpcclient

    from bench.harness import inputs, perf_analyzer, stats
    from client.embed import EmbedClient
    from pipelines import embedding

    ref = reference(bundle_dir)
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
