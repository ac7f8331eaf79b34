from pathlib import Path

import pytest
from pydantic import ValidationError

from popmq.config import PopConfig, load_config, parse_duration_ms


def test_defaults_follow_rocketmq() -> None:
    cfg = load_config(environ={})
    assert cfg.proxy.min_long_polling_ms == 5_000
    assert cfg.proxy.max_long_polling_ms == 20_000
    assert cfg.broker.pop.max_batch == 32
    assert cfg.broker.pop.max_attempts == 16
    assert cfg.broker.pop.min_invisible_ms == 10_000
    assert cfg.broker.pop.max_invisible_ms == 12 * 3_600_000
    assert cfg.broker.pop.retry_levels[:5] == ["1s", "5s", "10s", "30s", "1m"]
    assert cfg.broker.pop.retry_levels[-1] == "2h"


def test_precedence_file_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "popmq.yaml"
    path.write_text("proxy:\n  port: 9000\n  min_long_polling_ms: 1000\nbroker:\n  name: b1\n")
    env = {"POPMQ_PROXY__MIN_LONG_POLLING_MS": "2000", "POPMQ_BROKER__POP__MAX_ATTEMPTS": "3"}
    cfg = load_config(path, {"proxy.port": 9100}, environ=env)
    assert cfg.proxy.port == 9100
    assert cfg.proxy.min_long_polling_ms == 2000
    assert cfg.broker.pop.max_attempts == 3
    assert cfg.broker.name == "b1"


def test_bad_values_are_rejected() -> None:
    with pytest.raises(ValidationError):
        load_config(overrides={"proxy.min_long_polling_ms": 30_000}, environ={})
    with pytest.raises(ValidationError):
        load_config(overrides={"proxy.unknown_field": 1}, environ={})
    with pytest.raises(ValidationError):
        PopConfig(retry_levels=["1s", "soon"])


def test_retry_delays_scale_and_saturate() -> None:
    pop = PopConfig(time_scale=0.5)
    assert pop.retry_delay_ms(1) == 500
    assert pop.retry_delay_ms(5) == 30_000
    assert pop.retry_delay_ms(100) == 3_600_000
    assert parse_duration_ms("250ms") == 250


def test_broker_data_dir_follows_its_name(tmp_path: Path) -> None:
    """`popmq broker --name broker-b` without --data-dir: data/broker-b, not broker-a's."""
    from popmq.cli import build_parser
    from popmq.cli.common import config_from_args

    def broker_config(*argv: str):  # type: ignore[no-untyped-def]
        args = build_parser().parse_args(["broker", *argv])
        return config_from_args(args, {"broker.name": args.name, "broker.data_dir": args.data_dir})

    assert load_config(None, {}, environ={}).broker.data_dir == Path("data/broker-a")
    assert broker_config("--name", "broker-b").broker.data_dir == Path("data/broker-b")
    explicit = broker_config("--name", "broker-b", "--data-dir", str(tmp_path))
    assert explicit.broker.data_dir == tmp_path
    from_env = load_config(None, {}, environ={"POPMQ_BROKER__NAME": "broker-c"})
    assert from_env.broker.data_dir == Path("data/broker-c")
    file = tmp_path / "c.yaml"
    file.write_text("broker:\n  name: broker-d\n  data_dir: /srv/popmq\n")
    assert load_config(str(file), {}, environ={}).broker.data_dir == Path("/srv/popmq")


def test_etcd_endpoints_from_the_environment_as_a_comma_list_or_json() -> None:
    """POPMQ_*__ETCD__ENDPOINTS=http://a:2379 (the form the validator's comment promises) was
    JSON-decoded by pydantic-settings first: a SettingsError traceback, exit 1."""
    one = {"POPMQ_BROKER__ETCD__ENDPOINTS": "http://127.0.0.1:2379"}
    assert load_config(environ=one).broker.etcd.endpoints == ["http://127.0.0.1:2379"]
    two = {"POPMQ_PROXY__ETCD__ENDPOINTS": "http://a:2379, http://b:2379"}
    assert load_config(environ=two).proxy.etcd.endpoints == ["http://a:2379", "http://b:2379"]
    listed = {"POPMQ_PROXY__ETCD__ENDPOINTS": '["http://a:2379", "http://b:2379"]'}
    assert load_config(environ=listed).proxy.etcd.endpoints == ["http://a:2379", "http://b:2379"]


def test_an_undecodable_environment_value_is_a_user_error() -> None:
    """A POPMQ_* value pydantic-settings cannot decode (a list field given `[oops`) was a
    SettingsError traceback (exit 1), not a one-line `bad config`."""
    from popmq.cli.failures import user_message

    with pytest.raises(Exception) as caught:
        load_config(environ={"POPMQ_BROKER__POP__RETRY_LEVELS": "[oops"})
    message = user_message(caught.value)
    assert message is not None and "POPMQ_" in message.upper()
