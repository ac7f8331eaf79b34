"""The chart's memory limits and the receive limits and budgets derive from one another
(issue 20): the largest request each process accepts, and its in-flight budget, times the
copies it makes of them (measured, popmq.config), plus an idle process, fit the pod's limit."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from deploykit import CHART_DIR, container, render
from popmq.proxy.server import grpc_options

from popmq.config import (
    BROKER_COPIES_PER_REQUEST,
    PROCESS_BASELINE_BYTES,
    PROXY_COPIES_PER_REQUEST,
    PROXY_COPIES_WHILE_SERVED,
    PopmqConfig,
)

VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}


def quantity(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([KMG]i?)?", str(text)).groups()  # type: ignore[union-attr]
    return int(number) * _UNITS[unit or ""]


def chart_config(values: dict[str, Any]) -> PopmqConfig:
    return PopmqConfig.model_validate(values["config"])


@pytest.mark.parametrize("values", [VALUES], ids=["values.yaml"])
def test_the_broker_pod_fits_its_largest_request_and_budget(values: dict[str, Any]) -> None:
    config = chart_config(values).broker
    limit = quantity(values["broker"]["resources"]["limits"]["memory"])
    largest = max(config.max_message_bytes, config.max_inflight_bytes)
    assert largest * BROKER_COPIES_PER_REQUEST + PROCESS_BASELINE_BYTES <= limit


@pytest.mark.parametrize("values", [VALUES], ids=["values.yaml"])
def test_the_proxy_pod_fits_its_largest_request_and_budget(values: dict[str, Any]) -> None:
    config = chart_config(values).proxy
    limit = quantity(values["proxy"]["resources"]["limits"]["memory"])
    options = dict(grpc_options(config.max_body_bytes, max_request_bytes=config.max_request_bytes))
    largest_request = options["grpc.max_receive_message_length"]
    # One request being received (grpc's copies of it) while the budget's worth is served.
    receiving = largest_request * PROXY_COPIES_PER_REQUEST
    served = config.max_inflight_bytes * PROXY_COPIES_WHILE_SERVED
    assert receiving + served + PROCESS_BASELINE_BYTES <= limit, (
        f"{largest_request} bytes x {PROXY_COPIES_PER_REQUEST} copies being received and "
        f"{config.max_inflight_bytes} x {PROXY_COPIES_WHILE_SERVED} served do not fit {limit}"
    )


def test_a_smaller_proxy_limit_does_not_fit_a_maximal_batch() -> None:
    """What this check catches: 512Mi cannot hold one 32 x 4 MiB send on its way through with
    the defaults (1Gi could not either while a proxy held 10 copies of a request)."""
    small = {**VALUES, "proxy": {**VALUES["proxy"], "resources": {"limits": {"memory": "512Mi"}}}}
    with pytest.raises(AssertionError):
        test_the_proxy_pod_fits_its_largest_request_and_budget(small)


def test_the_proxy_limit_is_back_to_1gi() -> None:
    """Fewer copies of a body (issue 20): the chart's proxy limit went back from 2Gi to 1Gi."""
    assert quantity(VALUES["proxy"]["resources"]["limits"]["memory"]) == 1 << 30


def test_both_containers_bound_glibc_arenas() -> None:
    """MALLOC_ARENA_MAX reaches the broker and proxy containers (value mallocArenaMax), and is
    left unset when the value is null."""

    def arena_env(values: dict[str, Any] | None) -> list[str | None]:
        out = render(values)
        workloads = [*out.all("StatefulSet"), *out.all("Deployment")]
        return [
            {e["name"]: e.get("value") for e in container(w).get("env") or []}.get(
                "MALLOC_ARENA_MAX"
            )
            for w in workloads
            if w["metadata"]["name"].endswith(("-broker", "-proxy"))
        ]

    assert arena_env(None) == ["2", "2"]
    assert set(arena_env({"mallocArenaMax": None})) == {None}
