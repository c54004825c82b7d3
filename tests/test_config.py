"""Settings come from flags and the environment, validated."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.config import Settings


def test_flags_in_kebab_case_set_every_field() -> None:
    settings = Settings(
        _env_file=None,
        _cli_parse_args=["--port", "9001", "--max-batch-size", "4", "--quantization", "nf4"],
    )
    assert settings.port == 9001
    assert settings.max_batch_size == 4
    assert settings.quantization == "nf4"


def test_environment_uses_the_hymt_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYMT_MODEL_ID", "tencent/Hunyuan-MT-7B")
    monkeypatch.setenv("HYMT_MAX_WAIT_MS", "12.5")
    settings = Settings(_env_file=None)
    assert settings.model_id == "tencent/Hunyuan-MT-7B"
    assert settings.max_wait_ms == 12.5
    assert not settings.uses_demo_model


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(_env_file=None, quantization="int4")
    with pytest.raises(ValidationError, match="max_input_tokens"):
        Settings(_env_file=None, max_input_tokens=4096, max_batch_tokens=1024)


def test_several_api_processes_refuse_limits_each_would_count_alone() -> None:
    with pytest.raises(ValidationError, match="rate_limit and char_quota need api_processes=1"):
        Settings(_env_file=None, api_processes=4, rate_limit="10/minute")
    with pytest.raises(ValidationError, match="rate_limit and char_quota"):
        Settings(_env_file=None, api_processes=2, char_quota="1000/hour")
    # With Redis the processes count together.
    shared = Settings(
        _env_file=None, api_processes=2, char_quota="1000/hour", redis_url="redis://x:6379/0"
    )
    assert shared.redis_config().url == "redis://x:6379/0"
    policy = Settings(_env_file=None, api_processes=4, max_queue_size=512).policy_config()
    assert (policy.max_in_flight, policy.processes) == (512, 4)


def test_only_the_30b_a3b_has_its_think_blocks_taken_out() -> None:
    def think(**given: str) -> bool:
        return Settings(_env_file=None, **given).translation_config().think_tags  # type: ignore[arg-type]

    assert think(model_family="hy-mt2", model_size="30b-a3b")
    assert not think(model_family="hy-mt2", model_size="7b")
    assert not think()
