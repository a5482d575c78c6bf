#!/usr/bin/python3
"""Raw HTTP/2 frames against a server, for tests: what a well-behaved client library would
never send (malformed header blocks, floods), and what came back, one line a frame.

    scripts/h2-frames.py [--tls [--handshake-after PATH]] [--timeout SECONDS] HOST PORT < frames.jsonl

Standard input holds one JSON object a line, sent in order (a reader thread collects what the
server sends meanwhile, so a flood never dead-locks against the server's answers). The two
threads never use the socket at once: an OpenSSL connection must not be read and written
concurrently (a TLS read racing a write can see a clean end of stream the server never sent).

    {"frame": "preface"}                           the client preface and an empty SETTINGS
    {"frame": "settings", "ack": true}             SETTINGS (ack, or "settings": {"4": 65535})
    {"frame": "headers", "stream": 1, "flags": ["END_HEADERS", "END_STREAM"],
     "headers": [[":method", "GET"], ...]}         names and values as given (no lower-casing;
                                                   \\r, \\n and \\u0000 pass as bytes)
    {"frame": "continuation", "stream": 1, "flags": [], "headers": [["x", "y"]]}
    {"frame": "data", "stream": 1, "flags": ["END_STREAM"], "data": "text"}
    {"frame": "rst", "stream": 1, "code": 8}
    {"frame": "ping"}
    {"frame": "window_update", "stream": 0, "increment": 1}
    {"sleep": 0.2}                                 pause
    {"shutdown": "write"}                          send FIN (the client will send nothing more)
    {"wait_for": "HEADERS stream=1"}               read until a line starting so has come (or the timeout)

Any frame object may carry "repeat": N (sent N times; with "stream_step": 2 the stream id grows
by 2 each time). The HPACK encoder's state is kept across blocks, as a real client's is.

Standard output: one line a frame received, then `CLOSED` if the server closed the connection
(else `OPEN` after --settle seconds without a frame), and `SENT n` / `SEND_FAILED n` (frames
written before the server stopped taking them). Lines look like

    SETTINGS stream=0 flags= MAX_CONCURRENT_STREAMS=100 MAX_HEADER_LIST_SIZE=16384
    HEADERS stream=1 flags=END_HEADERS :status=503 content-length=57
    DATA stream=1 flags=END_STREAM len=57 body=...
    RST_STREAM stream=3 code=PROTOCOL_ERROR
    GOAWAY last_stream=3 code=ENHANCE_YOUR_CALM
"""

import argparse
import os
import json
import select
import socket
import ssl
import sys
import threading
import time

import hpack
from hyperframe import frame as hf

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR", 4: "SETTINGS_TIMEOUT",
          5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR",
          10: "CONNECT_ERROR", 11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}
SETTING_NAMES = {1: "HEADER_TABLE_SIZE", 2: "ENABLE_PUSH", 3: "MAX_CONCURRENT_STREAMS", 4: "INITIAL_WINDOW_SIZE",
                 5: "MAX_FRAME_SIZE", 6: "MAX_HEADER_LIST_SIZE", 8: "ENABLE_CONNECT_PROTOCOL"}


def text(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


class Reader(threading.Thread):
    """Reads frames until the server closes the connection; keeps one line a frame."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.io = threading.Lock()  # held for each socket call, by this thread and the writer
        self.lines = []
        self.closed = False
        self.changed = threading.Condition()
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 1 << 24
        self.last = time.monotonic()

    def add(self, line):
        with self.changed:
            self.lines.append(line)
            self.last = time.monotonic()
            self.changed.notify_all()

    def run(self):
        buffer = b""
        try:
            while True:
                with self.io:
                    pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
                if not pending and not select.select([self.sock], [], [], 0.05)[0]:
                    continue
                with self.io:
                    self.sock.setblocking(False)
                    try:
                        chunk = self.sock.recv(65536)
                    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                        continue  # a record not yet whole, or a TLS message with no data
                if not chunk:
                    break
                buffer += chunk
                while len(buffer) >= 9:
                    f, length = hf.Frame.parse_frame_header(memoryview(buffer[:9]))
                    if len(buffer) < 9 + length:
                        break
                    f.parse_body(memoryview(buffer[9:9 + length]))
                    buffer = buffer[9 + length:]
                    self.add(self.describe(f))
        except (ConnectionResetError, OSError):
            pass
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def describe(self, f):
        flags = ",".join(sorted(f.flags))
        if isinstance(f, hf.SettingsFrame):
            values = " ".join(f"{SETTING_NAMES.get(k, k)}={v}" for k, v in sorted(f.settings.items()))
            return f"SETTINGS stream=0 flags={flags} {values}".rstrip()
        if isinstance(f, (hf.HeadersFrame, hf.ContinuationFrame)):
            try:
                fields = " ".join(f"{text(n)}={text(v)}" for n, v in self.decoder.decode(f.data, raw=True))
            except Exception as error:  # noqa: BLE001 - any HPACK failure is a line to assert on
                fields = f"hpack-error={type(error).__name__}"
            kind = "HEADERS" if isinstance(f, hf.HeadersFrame) else "CONTINUATION"
            return f"{kind} stream={f.stream_id} flags={flags} {fields}".rstrip()
        if isinstance(f, hf.DataFrame):
            return f"DATA stream={f.stream_id} flags={flags} len={len(f.data)} body={text(bytes(f.data))!r}"
        if isinstance(f, hf.RstStreamFrame):
            return f"RST_STREAM stream={f.stream_id} code={ERRORS.get(f.error_code, f.error_code)}"
        if isinstance(f, hf.GoAwayFrame):
            return f"GOAWAY last_stream={f.last_stream_id} code={ERRORS.get(f.error_code, f.error_code)}"
        if isinstance(f, hf.PingFrame):
            return f"PING flags={flags}"
        if isinstance(f, hf.WindowUpdateFrame):
            return f"WINDOW_UPDATE stream={f.stream_id} increment={f.window_increment}"
        return f"{type(f).__name__} stream={f.stream_id} flags={flags}"

    def wait_for(self, prefix, timeout):
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(line.startswith(prefix) for line in self.lines) and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.changed.wait(left)

    def wait_quiet(self, timeout):
        """Until the server closes, or sends nothing for `timeout` seconds."""
        with self.changed:
            while not self.closed:
                left = self.last + timeout - time.monotonic()
                if left <= 0:
                    return
                self.changed.wait(left)


def frames(spec, encoder):
    kind = spec["frame"]
    stream = spec.get("stream", 0)
    flags = spec.get("flags", [])
    if kind == "preface":
        return PREFACE + hf.SettingsFrame(0).serialize()
    if kind == "settings":
        f = hf.SettingsFrame(0, settings={int(k): v for k, v in spec.get("settings", {}).items()})
        if spec.get("ack"):
            f.flags.add("ACK")
        return f.serialize()
    if kind in ("headers", "continuation"):
        block = encoder.encode([(n.encode("latin-1"), v.encode("latin-1")) for n, v in spec.get("headers", [])], huffman=False)
        f = hf.HeadersFrame(stream) if kind == "headers" else hf.ContinuationFrame(stream)
        f.data = block
        for flag in flags:
            f.flags.add(flag)
        return f.serialize()
    if kind == "data":
        f = hf.DataFrame(stream, data=spec.get("data", "").encode("latin-1"))
        for flag in flags:
            f.flags.add(flag)
        return f.serialize()
    if kind == "rst":
        return hf.RstStreamFrame(stream, error_code=spec.get("code", 8)).serialize()
    if kind == "ping":
        return hf.PingFrame(0, opaque_data=b"\0" * 8).serialize()
    if kind == "window_update":
        return hf.WindowUpdateFrame(stream, window_increment=spec.get("increment", 1)).serialize()
    raise SystemExit(f"unknown frame {kind}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tls", action="store_true", help="TLS with ALPN h2 (the certificate is not verified)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds a wait_for waits at most")
    parser.add_argument("--settle", type=float, default=None,
                        help="after the last line, seconds without a frame before printing (default: --timeout)")
    parser.add_argument("--handshake-after", metavar="PATH", default=None,
                        help="connect, then start TLS only once PATH exists (a connection mid-handshake)")
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    args = parser.parse_args()

    sock = socket.create_connection((args.host, args.port), timeout=30)
    # Frames go out as written: a HEADERS frame sent after a wait_for is not held back for the
    # ACK of the previous one (Nagle's algorithm behind the server's delayed ACK).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if args.tls:
        while args.handshake_after and not os.path.exists(args.handshake_after):
            time.sleep(0.01)
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        sock = context.wrap_socket(sock, server_hostname=args.host)
        print(f"ALPN {sock.selected_alpn_protocol()}")
    reader = Reader(sock)
    reader.start()
    encoder = hpack.Encoder()
    sent, failed = 0, False
    for line in sys.stdin:
        if not line.strip() or failed:
            continue
        spec = json.loads(line)
        if "sleep" in spec:
            time.sleep(spec["sleep"])
            continue
        if "wait_for" in spec:
            reader.wait_for(spec["wait_for"], args.timeout)
            continue
        if spec.get("shutdown") == "write":
            with reader.io:
                sock.shutdown(socket.SHUT_WR)
            continue
        for i in range(spec.get("repeat", 1)):
            step = dict(spec, stream=spec.get("stream", 0) + i * spec.get("stream_step", 0))
            try:
                with reader.io:
                    sock.settimeout(30)
                    sock.sendall(frames(step, encoder))
                sent += 1
            except OSError:
                failed = True
                break
    reader.wait_quiet(args.timeout if args.settle is None else args.settle)
    with reader.changed:
        for line in reader.lines:
            print(line)
        print("CLOSED" if reader.closed else "OPEN")
    print(f"SEND_FAILED {sent}" if failed else f"SENT {sent}")
    sys.stdout.flush()
    try:
        sock.close()
    except OSError:
        pass


if __name__ == "__main__":
    main()
