import pytest

from popmq.bench.broker_throughput import bench_broker

pytestmark = pytest.mark.subprocess  # starts popmq or another process


async def test_bench_drains_everything_over_both_transports(tmp_path) -> None:
    report = await bench_broker(
        messages=640, producers=2, consumers=2, queues=2, flush_modes=("async", "sync"),
        transports=("inproc", "grpc"), data_dir=tmp_path,
    )  # fmt: skip
    assert set(report["results"]) == {"inproc/async", "inproc/sync", "grpc/async", "grpc/sync"}
    for label, figures in report["results"].items():
        # every message sent was popped and acked once, then read again by offset
        assert figures["acked"] == 640, label
        assert figures["pulled"] == 640, label
        assert figures["send_msgs_per_s"] > 0
        assert figures["pop_ack_msgs_per_s"] > 0
    assert report["params"]["batch"] == 32
