"""A proxy that does no work: the gRPC floor of `popmq bench e2e`.

It answers the e2e load generator's calls the way the proxy does (one route entry per broker,
one send entry per message, a ReceiveMessage stream of status + one frame per message +
delivery timestamp, one ack entry per handle) but stores nothing: sends only count messages
per broker (spread round robin per request, as the proxy picks queues), and a receive hands
out up to ``batch_size`` of the named broker's count as pre-built 1 KiB messages, waiting
for sends up to its long-polling time like a pop long poll. What is left of the machine's
CPU per message then is grpc.aio on both sides: the ceiling any Python gRPC proxy reaches
with this load generator, on this machine.

    python -m popmq.bench.floor --port 0 --brokers 3     # prints "... listening on HOST:PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal

import grpc

from popmq.event_loop import EVENT_LOOP_CHOICES, EVENT_LOOP_ENV
from popmq.event_loop import run as run_on_loop
from popmq.pb.rocketmq.v2 import definition_pb2 as pb
from popmq.pb.rocketmq.v2 import service_pb2 as s
from popmq.pb.rocketmq.v2 import service_pb2_grpc

OK = 20000
NOT_FOUND = 40401


def _message(body_bytes: int) -> pb.Message:
    """What a popped message looks like on the wire (same fields and sizes as the proxy's)."""
    msg = pb.Message(body=b"x" * body_bytes)
    msg.topic.name = "bench-e2e"
    system = msg.system_properties
    system.message_id = "0" * 32
    system.receipt_handle = "h" * 180
    system.body_digest.type = pb.CRC32
    system.body_digest.checksum = "00000000"
    system.body_encoding = pb.IDENTITY
    system.message_type = pb.NORMAL
    system.born_timestamp.GetCurrentTime()
    system.store_timestamp.GetCurrentTime()
    system.born_host = "bench"
    system.store_host = "broker-0"
    system.queue_id = 0
    system.queue_offset = 0
    system.delivery_attempt = 1
    system.invisible_duration.FromMilliseconds(60_000)
    return msg


class FloorServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, brokers: int, body_bytes: int) -> None:
        self.names = [f"broker-{i}" for i in range(brokers)]
        self.pending = dict.fromkeys(self.names, 0)
        self.arrived = {name: asyncio.Event() for name in self.names}
        self.turn = itertools.count()
        self.frame = s.ReceiveMessageResponse(message=_message(body_bytes))

    async def QueryRoute(self, request, context):
        response = s.QueryRouteResponse(status=pb.Status(code=OK))
        for name in self.names:
            response.message_queues.add(topic=request.topic, broker=pb.Broker(name=name))
        return response

    async def SendMessage(self, request, context):
        response = s.SendMessageResponse(status=pb.Status(code=OK))
        for msg in request.messages:
            response.entries.add(
                status=pb.Status(code=OK), message_id=msg.system_properties.message_id
            )
        broker = self.names[next(self.turn) % len(self.names)]
        self.pending[broker] += len(request.messages)
        self.arrived[broker].set()
        return response

    async def ReceiveMessage(self, request, context):
        broker = request.message_queue.broker.name
        if broker not in self.pending:
            broker = self.names[next(self.turn) % len(self.names)]
        poll_s = request.long_polling_timeout.ToMilliseconds() / 1000
        try:
            async with asyncio.timeout(poll_s):
                while not self.pending[broker]:
                    self.arrived[broker].clear()
                    await self.arrived[broker].wait()
        except TimeoutError:
            # As the protocol (and the proxy) answer an empty receive: status, then the
            # delivery timestamp (docs: CLIENT-FACTS, ReceiveMessage stream shape).
            await context.write(s.ReceiveMessageResponse(status=pb.Status(code=NOT_FOUND)))
            done = s.ReceiveMessageResponse()
            done.delivery_timestamp.GetCurrentTime()
            await context.write(done)
            return
        count = min(self.pending[broker], request.batch_size)
        self.pending[broker] -= count
        await context.write(s.ReceiveMessageResponse(status=pb.Status(code=OK)))
        for _ in range(count):
            await context.write(self.frame)
        done = s.ReceiveMessageResponse()
        done.delivery_timestamp.GetCurrentTime()
        await context.write(done)

    async def AckMessage(self, request, context):
        response = s.AckMessageResponse(status=pb.Status(code=OK))
        for entry in request.entries:
            response.entries.add(
                status=pb.Status(code=OK),
                message_id=entry.message_id,
                receipt_handle=entry.receipt_handle,
            )
        return response


async def serve(host: str, port: int, brokers: int, body_bytes: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    service_pb2_grpc.add_MessagingServiceServicer_to_server(
        FloorServicer(brokers, body_bytes), server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    print(f"popmq floor proxy listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--body-bytes", type=int, default=1024)
    # The same loop as the servers it is compared with: a bench run passes its environment on.
    parser.add_argument(
        "--event-loop", choices=EVENT_LOOP_CHOICES, default=os.environ.get(EVENT_LOOP_ENV, "auto")
    )
    args = parser.parse_args()
    run_on_loop(serve(args.host, args.port, args.brokers, args.body_bytes), args.event_loop)


if __name__ == "__main__":
    main()
