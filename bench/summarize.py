"""Reads the wrk outputs of bench/run.sh and prints a Markdown table of medians and ratios."""
import re
import statistics
import sys

work, connections, reps, rss_kb, duration = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]


def ms(value):
    number, unit = re.match(r"([\d.]+)(us|ms|s)", value).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def parse(path):
    text = open(path).read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    p50 = ms(re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1))
    p99 = ms(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return rps, p50, p99, int(errors.group(1)) if errors else 0


print("| c | target | req/s (median) | p50 ms | p99 ms | req/s vs nginx | p99 − nginx p99 |")
print("|---|---|---|---|---|---|---|")
for c in connections:
    medians = {}
    for name in ["direct", "nginx", "sessiongate"]:
        runs = [parse(f"{work}/wrk-{name}-{c}-{r}.txt") for r in range(1, reps + 1)]
        if any(run[3] for run in runs):
            print(f"WARNING: {name} at c={c} returned non-2xx responses", file=sys.stderr)
        medians[name] = tuple(statistics.median(run[i] for run in runs) for i in range(3))
    nginx_rps, _, nginx_p99 = medians["nginx"]
    for name, (rps, p50, p99) in medians.items():
        ratio = f"{rps / nginx_rps:.2f}×" if name != "direct" else "—"
        delta = f"{p99 - nginx_p99:+.2f} ms" if name == "sessiongate" else "—"
        print(f"| {c} | {name} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {ratio} | {delta} |")
print()
print(f"sessiongate peak RSS over the whole run: {rss_kb / 1024:.0f} MiB")
