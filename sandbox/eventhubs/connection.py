"""One client connection: header and SASL exchange, then the connection/session/link state machine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any, Dict, List, Optional

from . import management
from .addresses import Address, parse_address
from .codec import (
    AMQP_HEADER,
    SASL_HEADER,
    Accepted,
    AMQPError,
    Frame,
    Rejected,
    Source,
    Target,
    decode_payload,
    encode,
    encode_message,
    parse,
    perf,
)
from .filters import FilterError, parse_filters
from .links import RECEIVE_CREDIT, SESSION_WINDOW, Link, Session
from .publish import publish
from .store import Broker

log = logging.getLogger("sandbox.eventhubs")

MAX_FRAME_SIZE = 65536
MAX_MESSAGE_SIZE = 1024 * 1024  # what a Standard-tier namespace allows
SASL_MECHANISMS = [b"ANONYMOUS", b"PLAIN", b"MSSBCBS", b"EXTERNAL"]
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)


class ProtocolError(Exception):
    pass


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, broker: Broker) -> None:
        self.reader = reader
        self.writer = writer
        self.broker = broker
        self.sessions: Dict[int, Session] = {}
        self.remote_max_frame = MAX_FRAME_SIZE
        self.closed = False
        self._heartbeat: Optional[asyncio.Task] = None

    # ---- I/O
    def send(self, channel: int, performative: Any, sasl: bool = False) -> None:
        if not self.closed:
            self.writer.write(encode(channel, performative, sasl=sasl))

    async def _read_frame(self) -> Frame:
        header = await self.reader.readexactly(8)
        size = struct.unpack(">I", header[:4])[0]
        if size < 8 or size > MAX_FRAME_SIZE:
            raise ProtocolError(f"frame size {size} outside 8..{MAX_FRAME_SIZE}")
        body = await self.reader.readexactly(size - 8)
        return parse(header, body)

    async def run(self) -> None:
        try:
            await self._handshake()
            while not self.closed:
                frame = await self._read_frame()
                self._dispatch(frame)
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away
        except ProtocolError as exc:
            log.warning("closing connection: %s", exc)
            self.send(0, perf.CloseFrame(error=AMQPError(condition=b"amqp:connection:framing-error",
                                                         description=str(exc))))
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        if self._heartbeat:
            self._heartbeat.cancel()
        for session in list(self.sessions.values()):
            self._end_session(session)
        self.closed = True
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()

    async def _handshake(self) -> None:
        header = await self.reader.readexactly(8)
        if header == SASL_HEADER:
            self.writer.write(SASL_HEADER)
            self.send(0, perf.SASLMechanism(sasl_server_mechanisms=SASL_MECHANISMS), sasl=True)
            init = await self._read_frame()
            if init.code != 0x41:
                raise ProtocolError("expected sasl-init")
            # Every mechanism is accepted: the sandbox authenticates nobody (loopback only).
            self.send(0, perf.SASLOutcome(code=0, additional_data=None), sasl=True)
            header = await self.reader.readexactly(8)
        if header != AMQP_HEADER:
            self.writer.write(AMQP_HEADER)
            raise ProtocolError(f"unsupported protocol header {header!r}")
        self.writer.write(AMQP_HEADER)

    # ---- dispatch
    def _dispatch(self, frame: Frame) -> None:
        if frame.code == -1:
            return  # heartbeat
        handler = {OPEN: self._on_open, BEGIN: self._on_begin, ATTACH: self._on_attach, FLOW: self._on_flow,
                   TRANSFER: self._on_transfer, DISPOSITION: self._on_disposition, DETACH: self._on_detach,
                   END: self._on_end, CLOSE: self._on_close}.get(frame.code)
        if handler is None:
            raise ProtocolError(f"unexpected performative 0x{frame.code:02x}")
        if frame.code not in (OPEN, BEGIN, CLOSE) and frame.channel not in self.sessions:
            # A late frame for a session already ended (the SDK can detach after ending): nothing to do.
            log.debug("ignoring 0x%02x on ended channel %d", frame.code, frame.channel)
            return
        handler(frame.channel, frame.fields)

    def _on_open(self, channel: int, f: List[Any]) -> None:
        self.remote_max_frame = min(f[2] or MAX_FRAME_SIZE, 1 << 24)
        self.send(0, perf.OpenFrame(container_id="sandbox-eventhubs", hostname=None,
                                    max_frame_size=MAX_FRAME_SIZE, channel_max=255, idle_timeout=None,
                                    outgoing_locales=None,
                                    incoming_locales=None, offered_capabilities=None,
                                    desired_capabilities=None, properties=None))
        if f[4]:  # the client wants a frame at least every idle_timeout ms
            self._heartbeat = asyncio.ensure_future(self._beat(f[4] / 2000.0))

    async def _beat(self, every: float) -> None:
        while not self.closed:
            await asyncio.sleep(every)
            self.send(0, None)

    def _on_begin(self, channel: int, f: List[Any]) -> None:
        session = Session(channel=channel, next_incoming_id=f[1])
        self.sessions[channel] = session
        self.send(channel, perf.BeginFrame(remote_channel=channel, next_outgoing_id=0,
                                           incoming_window=SESSION_WINDOW, outgoing_window=SESSION_WINDOW,
                                           handle_max=1023, offered_capabilities=None,
                                           desired_capabilities=None, properties=None))

    def _session(self, channel: int) -> Session:
        session = self.sessions.get(channel)
        if session is None:
            raise ProtocolError(f"no session on channel {channel}")
        return session

    # ---- links
    def _on_attach(self, channel: int, f: List[Any]) -> None:
        session = self._session(channel)
        name, handle, client_role_receiver = f[0], f[1], bool(f[2])
        source, target = f[5] or [], f[6] or []
        name = name.decode() if isinstance(name, bytes) else name
        src_addr = _text(source[0]) if source else None
        tgt_addr = _text(target[0]) if target else None
        address = parse_address(src_addr if client_role_receiver else tgt_addr)
        link = Link(name=name, handle=handle, client_sends=not client_role_receiver, address=address)
        session.links[handle] = link
        filters = source[7] if len(source) > 7 else None
        error = self._resolve(link, filters)
        echo_filters = ({k: (k, v) for k, v in filters.items()} if isinstance(filters, dict) else None)
        self.send(channel, perf.AttachFrame(
            name=name, handle=handle, role=not client_role_receiver, send_settle_mode=f[3],
            rcv_settle_mode=f[4], source=Source(address=src_addr, filters=echo_filters),
            target=Target(address=tgt_addr), unsettled=None, incomplete_unsettled=None,
            initial_delivery_count=None if link.client_sends else 0, max_message_size=MAX_MESSAGE_SIZE,
            offered_capabilities=None, desired_capabilities=None, properties=None))
        if error is not None:
            log.info("refusing link %r: %s", address.raw, error.description)
            link.detached = True
            self.send(channel, perf.DetachFrame(handle=handle, closed=True, error=error))
            return
        if link.client_sends:
            link.delivery_count = f[9] or 0
            self._grant(session, link)
        elif link.partition is not None:
            link.task = asyncio.ensure_future(self._pump(session, link))

    def _resolve(self, link: Link, filters: Any) -> Optional[AMQPError]:
        """Bind the link to what its address names; an AMQPError if it names nothing we serve."""
        addr = link.address
        if addr.kind in ("cbs", "management"):
            return None
        hub = self.broker.hub(addr.hub) if addr.hub else None
        if hub is None:
            known = ", ".join(sorted(self.broker.hubs)) or "none"
            return _not_found(f"The messaging entity '{addr.hub or addr.raw}' could not be found "
                              f"(address {addr.raw!r}; hubs here: {known}).")
        link.hub = hub
        if addr.kind == "hub" and link.client_sends:
            return None
        if addr.kind in ("partition", "consumer"):
            partition = hub.partition(addr.partition or "")
            if partition is None:
                return _not_found(f"Partition '{addr.partition}' does not exist in hub '{hub.name}' "
                                  f"(partitions 0..{len(hub.partitions) - 1}).")
            link.partition = partition
        if addr.kind == "partition" and link.client_sends:
            return None
        if addr.kind == "consumer" and not link.client_sends:
            if not hub.has_consumer_group(addr.consumer_group or ""):
                return _not_found(f"Consumer group '{addr.consumer_group}' does not exist "
                                  f"in hub '{hub.name}'.")
            try:
                link.next_sequence = parse_filters(filters).first_sequence(link.partition)
            except FilterError as exc:
                return AMQPError(condition=b"amqp:invalid-field", description=str(exc), info=None)
            return None
        verb = "send to" if link.client_sends else "receive from"
        return AMQPError(condition=b"amqp:not-allowed", info=None,
                         description=f"cannot {verb} {addr.raw!r}: send to HUB or HUB/Partitions/N, "
                                     "receive from HUB/ConsumerGroups/CG/Partitions/N")

    def _grant(self, session: Session, link: Link) -> None:
        link.credit = RECEIVE_CREDIT
        self._flow(session, link, link.credit)

    def _flow(self, session: Session, link: Optional[Link], credit: Optional[int],
              echo: bool = False) -> None:
        self.send(session.channel, perf.FlowFrame(
            next_incoming_id=session.next_incoming_id, incoming_window=SESSION_WINDOW,
            next_outgoing_id=session.next_outgoing_id, outgoing_window=SESSION_WINDOW,
            handle=link.handle if link else None, delivery_count=link.delivery_count if link else None,
            link_credit=credit, available=None, drain=None, echo=echo, properties=None))

    def _on_flow(self, channel: int, f: List[Any]) -> None:
        session = self._session(channel)
        handle = f[4]
        link = session.links.get(handle) if handle is not None else None
        if link is None:
            if f[9]:
                self._flow(session, None, None)
            return
        if link.client_sends:
            if f[9]:
                self._flow(session, link, link.credit)
            return
        # The client's credit: its delivery count plus credit, less what we have sent.
        remote_count = f[5] if f[5] is not None else 0
        link.credit = remote_count + (f[6] or 0) - link.delivery_count
        log.debug("flow on %s: count %s credit %s -> %d", link.address.raw, f[5], f[6], link.credit)
        link.drain = bool(f[8])
        self._send_outbox(session, link)
        if link.drain and link.task is None and not link.outbox:
            self._drained(session, link)
        link.wake.set()
        if f[9]:
            self._flow(session, link, link.credit)

    def _on_transfer(self, channel: int, f: List[Any]) -> None:
        session = self._session(channel)
        session.next_incoming_id += 1
        link = session.links.get(f[0])
        if link is None or not link.client_sends:
            raise ProtocolError(f"transfer on unknown or receiving handle {f[0]}")
        if link.partial_first is None:
            link.partial_first = f
            link.oversize = False
        if not link.oversize:
            link.partial.extend(f[-1])
            if len(link.partial) > MAX_MESSAGE_SIZE:  # keep reading its frames, but do not keep them
                link.oversize, link.partial = True, bytearray()
        if f[5]:  # more frames follow
            return
        first, payload = link.partial_first, bytes(link.partial)
        link.partial_first, link.partial = None, bytearray()
        link.credit -= 1
        link.delivery_count += 1
        if link.oversize:
            state = Rejected(error=AMQPError(condition=b"amqp:link:message-size-exceeded", info=None,
                                             description=f"message larger than {MAX_MESSAGE_SIZE} bytes"))
        else:
            state = self._deliver(session, link, first[3], payload)
        if not first[4] and link.detached is False:  # not pre-settled: tell the sender it is stored
            self.send(channel, perf.DispositionFrame(role=True, first=first[1], last=first[1], settled=True,
                                                     state=state, batchable=None))
        if link.credit < RECEIVE_CREDIT // 2:
            self._grant(session, link)

    def _deliver(self, session: Session, link: Link, message_format: Optional[int], payload: bytes) -> Any:
        kind = link.address.kind
        if kind in ("cbs", "management"):
            request = decode_payload(memoryview(payload))
            reply = management.cbs(request) if kind == "cbs" else management.management(request, self.broker)
            out = session.reply_link(kind)
            if out is not None:
                out.outbox.append(encode_message(reply))
                self._send_outbox(session, out)
            return Accepted()
        if link.hub is None:
            return Rejected(error=_not_found("link is not attached to a hub"))
        try:
            events = publish(link.hub, link.partition, payload, message_format)
        # ArithmeticError: the SDK's decoder overflows on a decimal128 its own encoder wrote
        except (ValueError, KeyError, IndexError, TypeError, ArithmeticError) as exc:
            return Rejected(error=AMQPError(condition=b"amqp:decode-error", info=None,
                                            description=f"could not read the message: {exc}"))
        log.debug("stored %d event(s) in %s", len(events), link.hub.name)
        return Accepted()

    def _drained(self, session: Session, link: Link) -> None:
        """Drain: nothing more to send now, so the rest of the credit is used up and reported."""
        if link.credit > 0:
            link.delivery_count += link.credit
            link.credit = 0
            self._flow(session, link, 0)

    def _send_outbox(self, session: Session, link: Link) -> None:
        while link.outbox and link.credit > 0:
            self._transfer(session, link, link.outbox.popleft())

    def _transfer(self, session: Session, link: Link, payload: bytes) -> None:
        delivery_id = session.next_outgoing_id
        tag = struct.pack(">I", link.delivery_count)
        link.delivery_count += 1
        link.credit -= 1
        room = max(self.remote_max_frame - 256, 512)  # leave room for the transfer performative
        chunks = [payload[i:i + room] for i in range(0, len(payload), room)] or [b""]
        for i, chunk in enumerate(chunks):
            first = i == 0
            self.send(session.channel, perf.TransferFrame(
                handle=link.handle, delivery_id=delivery_id if first else None,
                delivery_tag=tag if first else None, message_format=0 if first else None, settled=True,
                more=i < len(chunks) - 1, payload=chunk))
            session.next_outgoing_id += 1 if first else 0

    async def _pump(self, session: Session, link: Link) -> None:
        """Send a consumer every event from its position on, as credit allows; wait on the partition."""
        partition = link.partition
        assert partition is not None
        while not link.detached and not self.closed:
            if link.credit <= 0:
                link.wake.clear()
                await link.wake.wait()
                continue
            link.wake.clear()
            events = partition.read(link.next_sequence, link.credit)
            if not events:
                if link.drain:
                    self._drained(session, link)
                    continue
                # Wake on a new event or on the client's next flow (a drain request, say).
                waits = [asyncio.ensure_future(partition.wait_beyond(link.next_sequence)),
                         asyncio.ensure_future(link.wake.wait())]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waits:
                        waiter.cancel()
                continue
            for event in events:
                self._transfer(session, link, event.message)
                link.next_sequence = event.sequence_number + 1
            try:
                await self.writer.drain()
            except ConnectionError:
                return  # the client went away; run() tidies up

    def _on_disposition(self, channel: int, f: List[Any]) -> None:
        pass  # we send everything pre-settled; nothing waits on the client's outcome

    def _on_detach(self, channel: int, f: List[Any]) -> None:
        session = self._session(channel)
        link = session.links.pop(f[0], None)
        if link is None:
            return
        was_detached = link.detached
        self._stop_link(link)
        if not was_detached:
            self.send(channel, perf.DetachFrame(handle=f[0], closed=True, error=None))

    def _stop_link(self, link: Link) -> None:
        link.detached = True
        if link.task is not None:
            link.task.cancel()
            link.task = None
        link.wake.set()

    def _end_session(self, session: Session) -> None:
        for link in session.links.values():
            self._stop_link(link)
        session.links.clear()
        self.sessions.pop(session.channel, None)

    def _on_end(self, channel: int, f: List[Any]) -> None:
        session = self.sessions.get(channel)
        if session is not None:
            self._end_session(session)
        self.send(channel, perf.EndFrame(error=None))

    def _on_close(self, channel: int, f: List[Any]) -> None:
        self.send(0, perf.CloseFrame(error=None))
        self.closed = True


def _text(value: Any) -> Optional[str]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return value


def _not_found(description: str) -> AMQPError:
    return AMQPError(condition=b"amqp:not-found", description=description, info=None)


__all__ = ["Address", "Connection"]
