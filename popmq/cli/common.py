"""Helpers shared by the subcommands: turning flags into the one config model."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import yaml

from popmq.config import PopmqConfig, load_config


def parse_set_flags(pairs: list[str]) -> dict[str, Any]:
    """['proxy.port=9000'] -> {'proxy.port': 9000} (values parsed as YAML scalars/lists)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set needs KEY=VALUE, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def config_from_args(args: argparse.Namespace, flag_overrides: dict[str, Any]) -> PopmqConfig:
    """Defaults < --config file < POPMQ_* env < named flags < --set."""
    overrides = {k: v for k, v in flag_overrides.items() if v is not None}
    if getattr(args, "otlp_endpoint", None):
        overrides["tracing.otlp_endpoint"] = args.otlp_endpoint
    if getattr(args, "event_loop", None):
        overrides["server.event_loop"] = args.event_loop
    overrides.update(parse_set_flags(getattr(args, "set", []) or []))
    return load_config(getattr(args, "config", None), overrides)


def start_tracing_for(config: PopmqConfig, default_service: str) -> Callable[[], None] | None:
    """Tracing on when configured (--otlp-endpoint, tracing.* or OTEL_* env)."""
    from popmq.tracing import start_tracing

    service = config.tracing.service_name or default_service
    return start_tracing(config.tracing.otlp_endpoint, service)
