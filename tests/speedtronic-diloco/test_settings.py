from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from speedtronic_diloco.outer import DEFAULT_STALENESS_LIMIT
from speedtronic_diloco.settings import DEFAULT_MAX_LOCAL_ROUNDS, DistributedSettings


def test_defaults_are_the_2_0_async_defaults():
    settings = DistributedSettings.from_config(SimpleNamespace())
    assert (
        settings.async_delta_upload,
        settings.async_global_poll,
        settings.delta_upload_queue_size,
        settings.delta_upload_overflow,
        settings.delta_upload_shutdown_timeout,
    ) == (True, True, 1, "skip", 5.0)
    assert (
        settings.inner_steps,
        settings.outer_lr,
        settings.outer_momentum,
        settings.poll_interval,
    ) == (500, 0.7, 0.9, 60.0)
    assert settings.staleness_limit == DEFAULT_STALENESS_LIMIT and settings.role == "master"
    assert settings.max_local_rounds == DEFAULT_MAX_LOCAL_ROUNDS == 4


def test_the_config_sections_defaults_are_the_coordinators_defaults():
    from speedtronic_config.sections import DistributedConfig

    assert DistributedSettings.from_config(DistributedConfig()) == DistributedSettings.from_config(
        SimpleNamespace()
    )


def test_full_config_resolves_state_dir_under_output_dir_then_node_id():
    config = SimpleNamespace(
        run=SimpleNamespace(output_dir="out"),
        distributed=SimpleNamespace(role="worker", node_id="gpu-7", state_dir="st"),
    )
    settings = DistributedSettings.from_config(config)
    assert settings.state_dir == Path("out/st/gpu-7") and settings.role == "worker"
    absolute = DistributedSettings.from_config(SimpleNamespace(state_dir="/abs", node_id="n"))
    assert absolute.state_dir == Path("/abs/n")


def test_single_role_means_master_and_unlimited_staleness_is_null():
    settings = DistributedSettings.from_config(SimpleNamespace(role="single", staleness_limit=None))
    assert settings.role == "master" and settings.staleness_limit is None


def test_default_worker_node_id_is_path_safe():
    node_id = DistributedSettings.from_config(SimpleNamespace(role="worker")).node_id
    assert node_id.startswith("worker-") and "/" not in node_id


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("role", "boss", "distributed.role"),
        ("inner_steps", 0, "inner_steps"),
        ("delta_upload_queue_size", 0, "delta_upload_queue_size"),
        ("delta_upload_overflow", "drop", "delta_upload_overflow"),
        ("poll_interval", 0, "poll_interval"),
        ("node_id", "a/b", "path-safe"),
        ("max_local_rounds", 0, "max_local_rounds"),
    ],
)
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        DistributedSettings.from_config(SimpleNamespace(**{field: value}))
