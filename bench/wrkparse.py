"""Reads one wrk output (run with --latency): the numbers bench/*.sh report."""
import re


def ms(value):
    number, unit = re.match(r"([\d.]+)(us|ms|s)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def parse(path):
    """requests/s, p50 and p99 in ms, total requests, non-2xx/3xx responses, socket errors."""
    text = open(path).read()
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
        "p50": ms(re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1)),
        "p99": ms(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1)),
        "total": int(re.search(r"(\d+) requests in", text).group(1)),
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(int(n) for n in errors.groups()) if errors else 0,
    }
