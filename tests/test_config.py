"""Settings come from flags and the environment, validated."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config import server
from service.config.settings import Settings
from service.frontend import layers


def test_flags_in_kebab_case_set_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYMT_PORT", "9000")
    settings = Settings.from_flags(
        ["--port", "9001", "--fast-max-rows", "4", "--quantization", "nf4", "--no-warmup"],
        _env_file=None,
    )
    assert settings.server.port == 9001  # a flag over the environment
    assert settings.engine.max_rows == 4
    assert settings.model.quantization == "nf4"
    assert settings.model.warmup is False


def test_environment_uses_the_hymt_prefix_and_the_flat_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYMT_MODEL_ID", "tencent/Hunyuan-MT-7B")
    monkeypatch.setenv("HYMT_FAST_PAGE_SIZE", "64")
    monkeypatch.setenv("hymt_cors_origins", '["https://a.example"]')
    settings = Settings(_env_file=None)
    assert settings.model.model_id == "tencent/Hunyuan-MT-7B"
    assert settings.engine.page_size == 64
    assert settings.server.cors_origins == ["https://a.example"]
    assert not settings.uses_demo_model
    # Arguments come first; the engine receives its sub-model as it is.
    given = Settings(_env_file=None, fast_page_size=32)
    assert given.engine_config().fast is given.engine
    assert given.engine_config().fast.page_size == 32


def test_a_dotenv_file_is_read_below_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("HYMT_PORT=9100\nHYMT_MAX_QUEUE_SIZE=7\nOTHER=1\n")
    monkeypatch.setenv("HYMT_PORT", "9200")
    settings = Settings(_env_file=env_file)
    assert settings.server.port == 9200
    assert settings.limits.max_queue_size == 7


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown setting 'max_batch_size'"):
        Settings(_env_file=None, max_batch_size=4)


def test_invalid_values_are_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(_env_file=None, quantization="int4")
    with pytest.raises(ValidationError, match="max_input_tokens"):
        Settings(_env_file=None, max_input_tokens=4096, max_prompt_tokens=1024)


def test_several_api_processes_take_limits_and_their_number_from_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Limits are counted for all processes together (a shared file, or Redis): allowed.
    limited = Settings(_env_file=None, api_processes=4, rate_limit="10/minute")
    assert limited.server.processes == 4
    shared = Settings(
        _env_file=None, api_processes=2, char_quota="1000/hour", redis_url="redis://x:6379/0"
    )
    assert layers.redis_config(shared).url == "redis://x:6379/0"
    policy = layers.policy_config(Settings(_env_file=None, api_processes=4, max_queue_size=512))
    assert (policy.max_in_flight, policy.processes) == (512, 4)
    # Unset: half the cores, 1 to 8, and never more than the queue has places.
    for cores, expected in ((1, 1), (2, 1), (4, 2), (16, 8), (64, 8)):
        monkeypatch.setattr(server, "usable_cores", lambda cores=cores: cores)
        assert Settings(_env_file=None).server.processes == expected
    monkeypatch.setattr(server, "usable_cores", lambda: 16)
    assert Settings(_env_file=None, max_queue_size=3).server.processes == 3


def test_only_the_30b_a3b_has_its_think_blocks_taken_out() -> None:
    def think(**given: str) -> bool:
        return layers.translation_config(Settings(_env_file=None, **given)).think_tags

    assert think(model_family="hy-mt2", model_size="30b-a3b")
    assert not think(model_family="hy-mt2", model_size="7b")
    assert not think()


def test_the_default_queue_holds_a_full_engine_and_its_next_requests() -> None:
    # Admitting fewer texts than the engine's decode rows would leave rows idle under load.
    from service.engine.fast.plan import DEFAULT_CUDA_ROWS

    assert Settings(_env_file=None).limits.max_queue_size >= 2 * DEFAULT_CUDA_ROWS
