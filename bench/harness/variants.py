"""Serving variants as config overrides, loaded through Triton's model-control API.

No copy of the repository: each variant starts from the configs the server resolved for this
environment and changes only what it is about (batching, instance count, thread budget).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2

import model_config
from pipelines import classification, embedding

log = logging.getLogger(__name__)

STEPS = (classification.PREPROCESS, classification.CLASSIFIER, classification.POSTPROCESS)
THREAD_KEYS = ("intra_op_thread_count",)
# The variant that serves the repository's own configs: the one every target is about, so
# it alone gets the rate sweep, the traced cases and the response-cache rows.
SERVED = "batching"

Mutator = Callable[[model_config_pb2.ModelConfig], None]


@dataclass(frozen=True)
class Variant:
    """A named set of per-model config changes."""

    name: str
    description: str
    changes: dict[str, list[Mutator]] = field(default_factory=dict)
    models: tuple[str, ...] = STEPS  # the step models it (re)loads
    ensembles: tuple[str, ...] = (classification.ENSEMBLE,)  # reloaded after their steps

    def configs(
        self, repository: Path, config_name: str | None
    ) -> dict[str, model_config_pb2.ModelConfig]:
        """The full config of every step model under this variant."""
        configs = {}
        for model in self.models:
            config = model_config.resolve(repository / model, config_name)
            # Benchmarks measure capacity with closed-loop concurrency beyond the served queue
            # limit (the tuner reaches 64): no shedding here; bench.overload measures it.
            if config.HasField("dynamic_batching"):
                config.dynamic_batching.ClearField("default_queue_policy")
            for change in self.changes.get(model, []):
                change(config)
            configs[model] = config
        return configs


def without_dynamic_batching(config: model_config_pb2.ModelConfig) -> None:
    """Each request runs on its own (max_batch_size stays, so shapes are unchanged)."""
    config.ClearField("dynamic_batching")


def with_instances(count: int) -> Mutator:
    """Set the instance count of every instance group."""

    def change(config: model_config_pb2.ModelConfig) -> None:
        for group in config.instance_group:
            group.count = count

    return change


def with_threads(threads: int) -> Mutator:
    """Set onnxruntime's intra-op threads per instance.

    The Python runner and the native onnxruntime backend read the same parameter key.
    """

    def change(config: model_config_pb2.ModelConfig) -> None:
        if any(k in config.parameters for k in THREAD_KEYS):
            config.parameters["intra_op_thread_count"].string_value = str(threads)

    return change


def with_batching(preferred: list[int], delay_us: int) -> Mutator:
    """Dynamic batching with these preferred sizes and queue delay."""

    def change(config: model_config_pb2.ModelConfig) -> None:
        batching = config.dynamic_batching
        del batching.preferred_batch_size[:]
        batching.preferred_batch_size.extend(preferred)
        batching.max_queue_delay_microseconds = delay_us

    return change


def standard(server_cores: int, instances: int = 2) -> list[Variant]:
    """The variants every run compares, sized for the cores the server is pinned to."""
    fit = with_threads(server_cores)
    split = max(1, server_cores // instances)
    return [
        Variant(
            SERVED,
            f"repository configs (dynamic batching), classifier threads = {server_cores}",
            {classification.CLASSIFIER: [fit]},
        ),
        Variant(
            "no-batching",
            "dynamic batching removed from every step",
            {
                m: [without_dynamic_batching] + ([fit] if m == classification.CLASSIFIER else [])
                for m in STEPS
            },
        ),
        Variant(
            f"instances-{instances}",
            f"{instances} instances of preprocess and classifier, {split} thread(s) each",
            {
                classification.PREPROCESS: [with_instances(instances)],
                classification.CLASSIFIER: [with_instances(instances), with_threads(split)],
            },
        ),
    ]


def set_response_cache(
    client,
    models: tuple[str, ...],
    enabled: bool,
    repository: Path,
    config_name: str | None,
    headers: dict[str, str] | None = None,
) -> None:
    """Reload models with their response cache on or off (the rest of their config as is).

    Benchmarks of the computed path switch it off: perf_analyzer cycles through a few inputs,
    so with the cache on every request after the first few would be a hit.

    Args:
        client: a tritonclient HTTP or gRPC client of a server in explicit model-control mode.
        models: the models to reload.
        enabled: the response cache setting they get.
        repository: the model repository the server reads.
        config_name: the ``--model-config-name`` the server runs with.
        headers: the server's admin key header (``Server.admin_headers()``): model control is
            restricted by default.
    """
    for model in models:
        config = model_config.resolve(repository / model, config_name)
        config.response_cache.enable = enabled
        client.load_model(model, config=model_config.to_json(config), headers=headers)


def without_text_cache(
    client, repository: Path, config_name: str | None, headers: dict[str, str] | None = None
) -> None:
    """Load embed's one step with its per-text cache off, where embed is that one step.

    Benchmarks of the computed path need it off as much as the response cache: perf_analyzer
    repeats a few texts, which the step's own cache would answer after the first time. Load it
    before the ensembles that use it (they keep a step that is loaded).
    """
    embed = model_config.resolve(repository / embedding.ENSEMBLE, config_name)
    if embedding.TOKENIZE_ENCODE not in {s.model_name for s in embed.ensemble_scheduling.step}:
        return
    config = model_config.resolve(repository / embedding.TOKENIZE_ENCODE, config_name)
    config.parameters["text_cache_bytes"].string_value = "0"
    client.load_model(
        embedding.TOKENIZE_ENCODE, config=model_config.to_json(config), headers=headers
    )


def apply(
    client,
    variant: Variant,
    repository: Path,
    config_name: str | None,
    headers: dict[str, str] | None = None,
) -> None:
    """Load every step with the variant's config, then the ensemble (explicit model control).

    Args:
        client: a tritonclient HTTP or gRPC client of a server in explicit model-control mode.
        variant: the variant to load.
        repository: the model repository the server reads.
        config_name: the ``--model-config-name`` the server runs with.
        headers: the server's admin key header (``Server.admin_headers()``): model control is
            restricted by default.
    """
    for model, config in variant.configs(repository, config_name).items():
        client.load_model(model, config=model_config.to_json(config), headers=headers)
    for ensemble in variant.ensembles:
        client.load_model(ensemble, headers=headers)
    log.info("variant %s loaded", variant.name)
