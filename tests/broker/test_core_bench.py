from broker.bench import bench_broker


async def test_bench_smoke(tmp_path) -> None:
    report = await bench_broker(
        messages=640, producers=2, consumers=2, queues=2, flush_modes=("async", "sync"),
        data_dir=tmp_path,
    )  # fmt: skip
    for mode in ("async", "sync"):
        figures = report["results"][mode]
        assert figures["send_msgs_per_s"] > 0
        assert figures["pop_ack_msgs_per_s"] > 0
        assert figures["pull_msgs_per_s"] > 0
    assert report["params"]["batch"] == 32
