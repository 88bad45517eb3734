"""classify on a real tritonserver, over HTTP and gRPC, sync and asyncio.

Both ways it is served, where their behaviour is the contract: the ensemble and classify_fused
(the same pipeline in one step) give the same answers and the same errors.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest

from client.classify import AsyncClassifyClient, ClassifyClient
from client.connection import ClientError, module
from pipelines import classification, embedding
from tests.bad_images import bad_images, png_header
from tests.helpers import CAT_CLASSES, bash, batched_in_some_burst, run_cli, settled_executions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = ["http", "grpc"]
MODELS = [classification.ENSEMBLE, classification.FUSED]
# The step whose executions tell whether requests were batched together: preprocess is the
# ensemble's first.
BATCHING_STEP = {
    classification.ENSEMBLE: classification.PREPROCESS,
    classification.FUSED: classification.FUSED,
}
SCORE_ATOL = 1e-4


def url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def assert_matches_reference(predictions, reference, images, top_k=classification.DEFAULT_TOP_K):
    labels, scores, ids = reference.classify(images, top_k)
    assert len(predictions) == len(images)
    for got, want_labels, want_scores, want_ids in zip(
        predictions, labels, scores, ids, strict=True
    ):
        assert got.class_ids == want_ids.tolist()
        assert got.labels == [x.decode() for x in want_labels]
        np.testing.assert_allclose(got.scores, want_scores, atol=SCORE_ATOL)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_results_equal_the_in_process_reference(server, reference, photos, protocol, model):
    images = list(photos.values())
    with ClassifyClient(url(server, protocol), protocol, model) as client:
        client.check_ready()
        predictions = client.classify(images)
    assert_matches_reference(predictions, reference, images)
    chelsea = predictions[list(photos).index("chelsea")]
    assert chelsea.labels[0] in CAT_CLASSES
    assert {
        name: predictions[list(photos).index(name)].labels[0] for name in ("coffee", "flower")
    } == {"coffee": "espresso", "flower": "daisy"}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_top_k_is_chosen_per_request(server, reference, photos, protocol, model):
    images = [photos["chelsea"], photos["coffee"]]
    with ClassifyClient(url(server, protocol), protocol, model) as client:
        three = client.classify(images, top_k=3)
        default = client.classify(images)
        everything = client.classify(images[:1], top_k=classification.NUM_CLASSES)
    assert [len(p.labels) for p in three] == [3, 3]
    assert [len(p.labels) for p in default] == [classification.DEFAULT_TOP_K] * 2
    assert_matches_reference(three, reference, images, top_k=3)
    assert sum(everything[0].scores) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_asyncio_clients_under_concurrency(server, reference, photos, protocol):
    names = list(photos) * 4

    async def run():
        async with AsyncClassifyClient(url(server, protocol), protocol) as client:
            await client.check_ready()
            return await asyncio.gather(*(client.classify([photos[n]]) for n in names))

    results = asyncio.run(run())
    for name, predictions in zip(names, results, strict=True):
        assert_matches_reference(predictions, reference, [photos[name]])


@pytest.fixture(scope="module")
def variants_top_5(reference):
    """The images made from the photos with the raw pipeline's top-5 of each: made once for
    both models (a few seconds of decoding and inference)."""
    from export import samples

    made = samples.variants()
    _, _, want = reference.classify([data for _, data in made], classification.DEFAULT_TOP_K)
    return made, want


@pytest.mark.parametrize("model", MODELS)
def test_top_5_equals_the_raw_pipeline_on_216_images_made_from_the_photos(
    server, variants_top_5, model
):
    """Crops, rescales, rotations and mirror images (export.samples.variants), 8 at a time."""
    made, want = variants_top_5
    assert len(made) >= 200

    async def classify_all():
        async with AsyncClassifyClient(server.grpc_url, "grpc", model) as client:
            limit = asyncio.Semaphore(8)

            async def one(data):
                async with limit:
                    return await client.classify([data])

            return await asyncio.gather(*(one(data) for _, data in made))

    served = asyncio.run(classify_all())
    differ = [
        name
        for (name, _), (got,), ids in zip(made, served, want, strict=True)
        if got.class_ids != ids.tolist()
    ]
    assert differ == [], f"top-5 differs from the raw pipeline for {differ}"


def model_stats(server, model: str) -> dict:
    import tritonclient.http as http

    with http.InferenceServerClient(server.http_url) as client:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    return stats


def test_dynamic_batcher_forms_batches_across_requests(server, photos):
    requests = 48

    async def burst():
        async with AsyncClassifyClient(server.grpc_url, "grpc") as client:
            await asyncio.gather(*(client.classify([photos["coffee"]]) for _ in range(requests)))

    def burst_checked() -> int:
        before = model_stats(server, classification.CLASSIFIER)
        asyncio.run(burst())
        return settled_executions(
            lambda: model_stats(server, classification.CLASSIFIER), before, requests
        )

    assert batched_in_some_burst(burst_checked, requests), "the batcher never joined requests"


def raw_infer(
    server,
    protocol: str,
    inputs_spec: list[tuple[str, np.ndarray, str]],
    model=classification.ENSEMBLE,
):
    """Send a hand-made request, bypassing our client's checks; returns the error text."""
    mod = module(protocol)
    with mod.InferenceServerClient(url(server, protocol)) as client:
        inputs = []
        for name, array, dtype in inputs_spec:
            tensor = mod.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        try:
            client.infer(model, inputs)
        except Exception as exc:  # noqa: BLE001 - the test inspects the message
            return str(exc)
    return None


def images(*items: bytes) -> np.ndarray:
    return np.array(items, dtype=np.object_).reshape(-1, 1)


def bad_cases(photo: bytes, model: str = classification.ENSEMBLE) -> dict[str, tuple[list, str]]:
    return {
        "not-an-image": (
            [(classification.IMAGE, images(b"GIF? no, plain text"), "BYTES")],
            "not an image",
        ),
        "truncated-jpeg": (
            [(classification.IMAGE, images(photo[: len(photo) // 2]), "BYTES")],
            "truncated",
        ),
        **{
            name: ([(classification.IMAGE, images(data), "BYTES")], message)
            for name, (data, message) in bad_images(photo).items()
            if name not in ("truncated", "not-an-image")
        },
        "over-request-pixels": (
            [(classification.IMAGE, images(*[png_header(6000, 6000)] * 4), "BYTES")],
            "images too large: IMAGE holds 144000000 pixels",
        ),
        "empty-bytes": ([(classification.IMAGE, images(b""), "BYTES")], "empty input"),
        "empty-tensor": (
            [(classification.IMAGE, np.zeros((0, 1), np.object_), "BYTES")],
            "expected 1 string elements",
        ),
        "wrong-dtype": (
            [(classification.IMAGE, np.zeros((1, 1), np.float32), "FP32")],
            f"data-type is 'FP32', but model '{model}' expects 'BYTES'",
        ),
        "wrong-shape": (
            [(classification.IMAGE, images(photo, photo).reshape(1, 2), "BYTES")],
            "unexpected shape for input 'IMAGE'",
        ),
        "over-max-batch": (
            [(classification.IMAGE, images(*[photo] * 33), "BYTES")],
            "batch-size must be <= 32",
        ),
        "bad-top-k": (
            [
                (classification.IMAGE, images(photo), "BYTES"),
                (classification.TOP_K, np.array([[0]], np.int32), "INT32"),
            ],
            "TOP_K must be between 1 and 1000",
        ),
    }


CASES = list(bad_cases(b"x"))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input_gets_a_clear_error_and_the_server_stays_ready(
    server, photos, protocol, model, case
):
    inputs, expected = bad_cases(photos["chelsea"], model)[case]
    message = raw_infer(server, protocol, inputs, model)
    assert message is not None, "the bad request succeeded"
    assert expected in message
    assert ("400" if protocol == "http" else "INVALID_ARGUMENT") in message
    with ClassifyClient(url(server, protocol), protocol, model) as client:
        client.check_ready()
        assert client.classify([photos["chelsea"]])[0].labels[0] in CAT_CLASSES


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_kind_of_bad_image_in_a_formed_batch_fails_alone(
    server, reference, photos, protocol, model
):
    bad = {data: message for data, message in bad_images(photos["coffee"]).values()}
    good = [photos["chelsea"], photos["coffee"], photos["flower"]]
    plan = [*good, *bad] * 3

    # A full batch of photos goes first: while the first step's one instance decodes it, the
    # burst queues behind it and the batcher joins what queued, however slowly a busy client
    # sends.
    blocker = [photos["flower"]] * 32

    async def burst():
        async with AsyncClassifyClient(url(server, protocol), protocol, model) as client:
            return await asyncio.gather(
                client.classify(blocker),
                *(client.classify([img]) for img in plan),
                return_exceptions=True,
            )

    def burst_checked() -> int:
        step = BATCHING_STEP[model]
        before = model_stats(server, step)
        first, *results = asyncio.run(burst())
        assert len(first) == len(blocker)
        for img, result in zip(plan, results, strict=True):
            if img in bad:
                assert isinstance(result, ClientError)
                assert f"IMAGE[0]: {bad[img]}" in str(result)
            else:
                assert_matches_reference(result, reference, [img])
        return settled_executions(lambda: model_stats(server, step), before, 1 + len(plan))

    assert batched_in_some_burst(burst_checked, 1 + len(plan)), "never batched with the bad ones"


@pytest.mark.parametrize(
    ("protocol", "model"), [("http", classification.ENSEMBLE), ("grpc", classification.FUSED)]
)
def test_cli_prints_labels_and_scores(server, photos, tmp_path, protocol, model):
    cat = tmp_path / "chelsea.jpg"
    cat.write_bytes(photos["chelsea"])
    done = run_cli(
        *("classify", str(cat), "--url", url(server, protocol), "--protocol", protocol),
        *("--top-k", "3", "--priority", "1", "--model", model),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(cat)
    assert len(lines) == 4
    top = re.match(r"\s+([0-9.]+)\s+(.+) \((\d+)\)$", lines[1])
    assert top and top.group(2) in CAT_CLASSES


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cli_explains_an_unreachable_server_without_a_traceback(photos, tmp_path, protocol):
    from server.launcher import free_port

    cat = tmp_path / "chelsea.jpg"
    cat.write_bytes(photos["chelsea"])
    done = run_cli(
        "classify", str(cat), "--url", f"127.0.0.1:{free_port()}", "--protocol", protocol
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: cannot reach Triton at 127.0.0.1:")
    assert "Traceback" not in done.stderr


def test_cli_reports_a_bad_image_without_a_traceback(server, tmp_path):
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"not a jpeg")
    done = run_cli("classify", str(junk), "--url", server.http_url)
    assert done.returncode == 1
    assert "IMAGE[0]: not an image" in done.stderr and "Traceback" not in done.stderr


def readme_block(marker: str, language: str = "bash") -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\s*```{language}\n(.*?)```", text, re.S)
    assert match, f"README has no block marked {marker}"
    return match.group(1)


def test_readme_python_example_works(server):
    script = readme_block("python-example", "python").replace("localhost:8000", server.http_url)
    scope: dict = {}
    exec(script, scope)
    assert scope["vectors"].shape == (1, embedding.HIDDEN_SIZE)


def test_readme_python_classify_example_works(server, photos, tmp_path, monkeypatch, capsys):
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "chelsea.jpg").write_bytes(photos["chelsea"])
    monkeypatch.chdir(tmp_path)  # the example reads samples/ relative to where it runs
    script = readme_block("python-classify-example", "python")
    scope: dict = {}
    exec(script.replace("localhost:8000", server.http_url), scope)
    assert scope["top"].labels[0] in CAT_CLASSES and len(scope["top"].labels) == 3
    assert scope["top"].labels[0] in capsys.readouterr().out


def test_readme_curl_embed_example_works(server):
    script = readme_block("curl-embed-example").replace("localhost:8000", server.http_url)
    [output] = json.loads(bash(script))["outputs"]
    assert output["name"] == embedding.EMBEDDING and output["shape"] == [2, embedding.HIDDEN_SIZE]
    vectors = np.array(output["data"]).reshape(output["shape"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)


def test_readme_curl_example_works(server, photos, tmp_path):
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "chelsea.jpg").write_bytes(photos["chelsea"])
    script = readme_block("curl-example").replace("localhost:8000", server.http_url)
    response = json.loads(bash(script, cwd=tmp_path))
    outputs = {o["name"]: o["data"] for o in response["outputs"]}
    assert outputs[classification.LABELS][0] in CAT_CLASSES
    assert len(outputs[classification.SCORES]) == classification.DEFAULT_TOP_K
