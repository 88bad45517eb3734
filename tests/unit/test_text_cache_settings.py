"""The per-text cache's shared-layer settings: written once, in pipelines/text_cache.py."""

from __future__ import annotations

import dataclasses

import model_config
from paths import MODEL_REPOSITORY
from pipelines import text_cache

SETTINGS = ("text_cache_ttl_s", "text_cache_timeout_ms", "text_cache_breaker_failures",
            "text_cache_breaker_reset_s")  # fmt: skip


def test_parameters_override_the_defaults_and_absent_ones_keep_them():
    default = text_cache.SharedSettings()
    assert text_cache.SharedSettings.from_parameters({}) == default
    changed = text_cache.SharedSettings.from_parameters(
        {"text_cache_timeout_ms": "20", "text_cache_breaker_failures": "3"}
    )
    assert changed == dataclasses.replace(default, timeout_s=0.02, breaker_failures=3)


def test_no_config_restates_a_default():
    """A config sets a shared-layer setting only to change it: the default lives in the code."""
    default = text_cache.SharedSettings()
    restated = []
    for path in [*MODEL_REPOSITORY.glob("*/config.pbtxt"), *MODEL_REPOSITORY.glob("*/configs/*")]:
        params = {k: v.string_value for k, v in model_config.parse(path).parameters.items()}
        mine = {k: v for k, v in params.items() if k in SETTINGS}
        if mine and text_cache.SharedSettings.from_parameters(mine) == default:
            restated.append(str(path.relative_to(MODEL_REPOSITORY)))
    assert not restated, f"restate SharedSettings' defaults: {restated}"
