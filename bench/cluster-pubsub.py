#!/usr/bin/env python3
"""Classic against sharded pub/sub on a Redis Cluster: how long a message takes from PUBLISH
(or SPUBLISH) on one master to a subscriber on another node — the path of a fleet message
(issue 27 §2). Starts its own cluster of three masters (no replicas) on free ports, sends
COUNT messages one at a time, and prints the latency percentiles of each kind.

    python3 bench/cluster-pubsub.py [COUNT]
"""
import os, shutil, socket, statistics, subprocess, sys, tempfile, time

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
CHANNEL = "sg:invalidate"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Conn:
    """A RESP2 connection: commands out, replies (and pushed messages) in."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b"-"):
            return rest.decode()
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise ValueError(line)

    def call(self, *args):
        self.send(*args)
        return self.read()


def main():
    work = tempfile.mkdtemp(prefix="sessiongate-pubsub-")
    ports = [free_port() for _ in range(3)]
    procs = []
    try:
        for p in ports:
            procs.append(subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                 "--dir", work, "--cluster-config-file", f"nodes-{p}.conf", "--cluster-port", str(free_port())],  # port + 10000 may not exist
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p in ports:
            for _ in range(100):
                try:
                    Conn(p).call("PING")
                    break
                except OSError:
                    time.sleep(0.05)
        subprocess.run(["redis-cli", "--cluster", "create"] + [f"127.0.0.1:{p}" for p in ports] + ["--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL)
        for _ in range(200):
            if all(b"cluster_state:ok" in Conn(p).call("CLUSTER", "INFO") for p in ports):
                break
            time.sleep(0.05)
        # The channel's slot owner (sharded pub/sub lives there).
        slot = Conn(ports[0]).call("CLUSTER", "KEYSLOT", CHANNEL)
        owner = next(p for p in ports if any(r[0] <= slot <= r[1] and r[2][1] == p for r in Conn(p).call("CLUSTER", "SLOTS")))
        others = [p for p in ports if p != owner]
        results = {}
        # Classic: subscribed on one node, published on another (the cluster bus carries it).
        # Sharded: subscribed on the slot's master, published there (SPUBLISH is routed by slot).
        for kind, sub_port, pub_port, sub_cmd, pub_cmd in [
            ("classic", others[0], others[1], "SUBSCRIBE", "PUBLISH"),
            ("sharded", owner, owner, "SSUBSCRIBE", "SPUBLISH"),
        ]:
            sub, pub = Conn(sub_port), Conn(pub_port)
            sub.call(sub_cmd, CHANNEL)
            latencies = []
            for i in range(COUNT):
                sent = time.perf_counter()
                pub.call(pub_cmd, CHANNEL, f"user {i}")
                message = sub.read()
                latencies.append((time.perf_counter() - sent) * 1e6)
                assert message[-1] == f"user {i}".encode(), message
            latencies.sort()
            results[kind] = (latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)], latencies[-1])
        version = Conn(ports[0]).call("INFO", "server").split(b"redis_version:")[1].split(b"\r")[0].decode()
        print(f"redis {version}, 3 masters, {COUNT} messages each, one at a time")
        print("| kind | publisher → subscriber | p50 µs | p99 µs | max µs |")
        print("|---|---|---|---|---|")
        for kind, (p50, p99, top) in results.items():
            path = "another master → a third node" if kind == "classic" else "the channel's slot master → itself"
            print(f"| {kind} | {path} | {p50:.0f} | {p99:.0f} | {top:.0f} |")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
