"""SQL92 filters at the broker: pop, pull and notify deliver exactly the matching messages.

Each expression's expected set comes from a reference written here in plain Python, separately
from the parser (broker/contract/sql92.py), over 200 messages with random properties."""

import random

import anyio
import pytest
from popmq.broker.contract.errors import Code, RefusedError
from popmq.broker.contract.types import (
    FILTER_SQL92,
    AckEntry,
    FilterExpression,
    Message,
    NotifyRequest,
    PopRequest,
    PullRequest,
    PullStatus,
)
from popmq.broker.testing import fast_broker_config, running_broker

REGIONS = ["eu", "us", "ap", "it's"]
TAGS = ["TagA", "TagB", ""]


def _num(props: dict, key: str) -> float | None:
    value = props.get(key)
    return None if value is None else float(value)


def _n(props: dict, key: str, test) -> bool:
    value = _num(props, key)
    return value is not None and test(value)


def _s(props: dict, key: str, test) -> bool:
    value = props.get(key)
    return value is not None and test(value)


# (expression, reference(tag, props) -> bool). Missing properties make comparisons unknown,
# and unknown is not a match, even under NOT (SQL's three-valued logic).
CASES = [
    ("a > 5", lambda t, p: _n(p, "a", lambda v: v > 5)),
    ("a >= 5", lambda t, p: _n(p, "a", lambda v: v >= 5)),
    ("a < 3", lambda t, p: _n(p, "a", lambda v: v < 3)),
    ("a <= 3", lambda t, p: _n(p, "a", lambda v: v <= 3)),
    ("a = 7", lambda t, p: _n(p, "a", lambda v: v == 7)),
    ("a <> 7", lambda t, p: _n(p, "a", lambda v: v != 7)),
    ("NOT (a = 7)", lambda t, p: _n(p, "a", lambda v: v != 7)),
    ("a BETWEEN 2 AND 6", lambda t, p: _n(p, "a", lambda v: 2 <= v <= 6)),
    ("a NOT BETWEEN 2 AND 6", lambda t, p: _n(p, "a", lambda v: not 2 <= v <= 6)),
    ("price > 49.5", lambda t, p: _n(p, "price", lambda v: v > 49.5)),
    ("price BETWEEN 10.25 AND 20.75", lambda t, p: _n(p, "price", lambda v: 10.25 <= v <= 20.75)),
    ("price < -1", lambda t, p: _n(p, "price", lambda v: v < -1)),
    ("region = 'eu'", lambda t, p: p.get("region") == "eu"),
    ("region <> 'eu'", lambda t, p: _s(p, "region", lambda v: v != "eu")),
    ("region IN ('eu', 'us')", lambda t, p: p.get("region") in ("eu", "us")),
    ("region NOT IN ('eu', 'us')", lambda t, p: _s(p, "region", lambda v: v not in ("eu", "us"))),
    ("region = 'it''s'", lambda t, p: p.get("region") == "it's"),
    ("region IS NULL", lambda t, p: "region" not in p),
    ("region IS NOT NULL", lambda t, p: "region" in p),
    ("TAGS IS NOT NULL", lambda t, p: t != ""),
    ("TAGS = 'TagA'", lambda t, p: t == "TagA"),
    ("TAGS IN ('TagA', 'TagB') AND a > 10", lambda t, p: t != "" and _n(p, "a", lambda v: v > 10)),
    (
        "a > 5 AND region IN ('eu', 'us') AND TAGS IS NOT NULL",
        lambda t, p: _n(p, "a", lambda v: v > 5) and p.get("region") in ("eu", "us") and t != "",
    ),
    (
        "a > 15 OR region = 'ap'",
        lambda t, p: _n(p, "a", lambda v: v > 15) or p.get("region") == "ap",
    ),
    (
        "(a < 3 OR a > 17) AND NOT region = 'us'",
        lambda t, p: _n(p, "a", lambda v: v < 3 or v > 17) and _s(p, "region", lambda v: v != "us"),
    ),
    ("name STARTSWITH 'ab'", lambda t, p: _s(p, "name", lambda v: v.startswith("ab"))),
    ("name CONTAINS 'c'", lambda t, p: _s(p, "name", lambda v: "c" in v)),
    ("name NOT ENDSWITH 'd'", lambda t, p: _s(p, "name", lambda v: not v.endswith("d"))),
    (
        "a > 5 and b is null or price >= 90",
        lambda t, p: (
            (_n(p, "a", lambda v: v > 5) and "b" not in p) or _n(p, "price", lambda v: v >= 90)
        ),
    ),
    ("FALSE OR a = 0", lambda t, p: _n(p, "a", lambda v: v == 0)),
]


def _messages(topic: str, count: int = 200, seed: int = 21) -> list[Message]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        props: dict[str, str] = {}
        if rng.random() < 0.85:
            props["a"] = str(rng.randint(0, 20))
        if rng.random() < 0.8:
            props["price"] = f"{rng.uniform(-5, 100):.2f}"
        if rng.random() < 0.8:
            props["region"] = rng.choice(REGIONS)
        if rng.random() < 0.5:
            props["b"] = "x"
        if rng.random() < 0.7:
            props["name"] = "".join(rng.choice("abcd") for _ in range(rng.randint(1, 4)))
        out.append(Message(topic, f"m{i}".encode(), tag=rng.choice(TAGS), properties=props))
    return out


def _expected(messages: list[Message], reference) -> set[bytes]:
    return {m.body for m in messages if reference(m.tag, m.properties)}


def _sql(expression: str) -> FilterExpression:
    return FilterExpression(expression, FILTER_SQL92)


async def _pop_all(broker, group: str, topic: str, expression: str) -> list[bytes]:
    got: list[bytes] = []
    while True:
        request = PopRequest(group, topic, max_messages=32, invisible_time_ms=60_000,
                             filter=_sql(expression))  # fmt: skip
        result = await broker.pop(request)
        if not result.messages:
            return got
        got += [p.message.body for p in result.messages]
        entries = [AckEntry(p.receipt_handle) for p in result.messages]
        await broker.ack(group, topic, entries)


async def _pull_all(broker, topic: str, queue_count: int, expression: str) -> list[bytes]:
    got: list[bytes] = []
    for queue_id in range(queue_count):
        offset = 0
        while True:
            request = PullRequest(topic, queue_id, offset, 32, filter=_sql(expression))
            result = await broker.pull(request)
            got += [m.body for m in result.messages]
            if result.status != PullStatus.FOUND:
                break
            offset = result.next_offset
    return got


async def test_thirty_expressions_against_two_hundred_messages(tmp_path) -> None:
    assert len(CASES) == 30
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        messages = _messages("sql")
        for start in range(0, len(messages), 20):  # several sends, spread over the queues
            await broker.send(messages[start : start + 20])
        queue_count = (await broker.get_topic("sql")).queue_count
        for number, (expression, reference) in enumerate(CASES):
            expected = _expected(messages, reference)
            assert 0 < len(expected) < len(messages), expression  # the case tells something
            popped = await _pop_all(broker, f"g{number}", "sql", expression)
            assert len(popped) == len(set(popped)), expression
            assert set(popped) == expected, expression
            pulled = await _pull_all(broker, "sql", queue_count, expression)
            assert sorted(pulled) == sorted(expected), expression


async def test_notify_is_not_woken_by_messages_the_filter_leaves_out(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.create_topic("n", 1)
        answers: list[bool] = []
        answered = anyio.Event()

        async def wait_for_match() -> None:
            request = NotifyRequest("g", "n", poll_time_ms=10_000, filter=_sql("a > 5"))
            answers.append((await broker.notify(request)).has_message)
            answered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_match)
            await anyio.sleep(0.2)
            for _ in range(11):  # more than one scan's worth (1024) of non-matching ones
                await broker.send(
                    [Message("n", b"no", properties={"a": str(i % 5)}) for i in range(100)]
                )
            await anyio.sleep(0.3)
            assert answers == []  # still held: nothing it wants arrived
            await broker.send([Message("n", b"yes", properties={"a": "6"})])
            with anyio.fail_after(5):
                await answered.wait()
        assert answers == [True]
        popped = await _pop_all(broker, "g", "n", "a > 5")
        assert popped == [b"yes"]


async def test_held_pop_gets_only_the_matching_message(tmp_path) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.create_topic("h", 2)
        result = []

        async def held_pop() -> None:
            request = PopRequest("g", "h", max_messages=4, invisible_time_ms=60_000,
                                 poll_time_ms=10_000, filter=_sql("kind = 'wanted'"))  # fmt: skip
            result.append(await broker.pop(request))

        async with anyio.create_task_group() as tg:
            tg.start_soon(held_pop)
            await anyio.sleep(0.2)
            await broker.send([Message("h", b"other", properties={"kind": "other"})] * 3)
            await anyio.sleep(0.2)
            assert result == []
            await broker.send([Message("h", b"wanted", properties={"kind": "wanted"})])
        assert [p.message.body for p in result[0].messages] == [b"wanted"]


@pytest.mark.parametrize(
    "expression", ["a >", "a = = 1", "TAGS IN ()", "", "region", "a > AND", "NOT"]
)
async def test_malformed_expressions_are_refused_at_the_broker(tmp_path, expression) -> None:
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.create_topic("bad", 1)
        calls = [
            broker.pop(PopRequest("g", "bad", filter=_sql(expression))),
            broker.pull(PullRequest("bad", 0, 0, filter=_sql(expression))),
            broker.notify(NotifyRequest("g", "bad", filter=_sql(expression))),
        ]
        for call in calls:
            with pytest.raises(RefusedError) as err:
                await call
            assert err.value.code == Code.ILLEGAL_FILTER_EXPRESSION


async def test_pop_over_a_long_unmatched_run_lets_the_loop_run(tmp_path) -> None:
    """A SQL92 pop decodes every message it passes over: thousands that do not match must not
    hold the broker's loop in one go. A held pop goes on in passes, others running between."""
    async with running_broker(fast_broker_config(tmp_path)) as broker:
        await broker.create_topic("long", 1)
        for _ in range(5):
            await broker.send([Message("long", b"no", properties={"a": "1"})] * 1000)
        await broker.send([Message("long", b"yes", properties={"a": "2"})])
        turns = 0
        popping = True

        async def others() -> None:
            nonlocal turns
            while popping:
                turns += 1
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(others)
            await anyio.lowlevel.checkpoint()
            before = turns
            request = PopRequest("g", "long", max_messages=1, poll_time_ms=60_000,
                                 filter=_sql("a = 2"))  # fmt: skip
            result = await broker.pop(request)
            during, popping = turns - before, False
        assert [p.message.body for p in result.messages] == [b"yes"]
        assert during >= 4, f"the loop ran {during} times during a pop over 5000 messages"

        # Answering at once (no poll time), a pop passes over one share and says what is left.
        await broker.send([Message("long", b"no", properties={"a": "1"})] * 3000)
        await broker.send([Message("long", b"last", properties={"a": "2"})])
        request = PopRequest("g2", "long", max_messages=1, filter=_sql("a = 2"))
        first = await broker.pop(request)
        assert first.messages == [] and first.rest_num > 0
        found: list[bytes] = []
        for _ in range(20):
            found += [p.message.body for p in (await broker.pop(request)).messages]
        assert found == [b"yes", b"last"]
