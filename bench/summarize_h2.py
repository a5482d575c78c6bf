"""Reads bench/h2.sh's h2load outputs and per-request logs: medians per scenario, CPU per
request, p99, ratios to nginx."""
import re
import statistics
import sys

work, points, reps = sys.argv[1], [p.split(":") for p in sys.argv[2].split()], int(sys.argv[3])
PAIRS = [("public", "nginx-h2", "sessiongate-h2-public"), ("cached session", "nginx-h2-cookie", "sessiongate-h2-cached")]
TARGET = 0.8  # issue 26 §3: sessiongate's HTTP/2 at least 0.8× nginx's requests/s


def h2load(path):
    """requests/s, requests done, and those not answered 2xx (failed, errored or another status)."""
    text = open(path).read()
    done, succeeded = map(int, re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", text).groups())
    status = re.search(r"status codes: (\d+) 2xx", text)
    return {
        "rps": float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", text).group(1)),
        "done": done,
        "bad": done - min(succeeded, int(status.group(1)) if status else 0),
    }


def p99_ms(path):
    """The 99th percentile of h2load's per-request times (third column, µs)."""
    times = sorted(int(line.split("\t")[2]) for line in open(path) if line.strip())
    return times[min(len(times) - 1, int(len(times) * 0.99))] / 1000 if times else float("nan")


print("| clients × streams | route | nginx req/s | sessiongate req/s | req/s vs nginx | target | nginx CPU µs/req | sessiongate CPU µs/req | CPU vs nginx | nginx p99 ms | sessiongate p99 ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for c, m in points:
    medians = {}
    for _, *scenarios in PAIRS:
        for s in scenarios:
            runs = []
            for r in range(1, reps + 1):
                name = f"{s}-{c}-{m}-{r}"
                h = h2load(f"{work}/h2load-{name}.txt")
                after, before = map(float, open(f"{work}/cpu-{name}.txt").read().split())
                if h["bad"]:
                    print(f"WARNING: {s} at -c {c} -m {m}: {h['bad']} of {h['done']} requests not answered 2xx", file=sys.stderr)
                runs.append((h["rps"], p99_ms(f"{work}/log-{name}.tsv"), (after - before) / max(h["done"], 1) * 1e6))
            medians[s] = tuple(statistics.median(run[i] for run in runs) for i in range(3))
    for label, nginx, gateway in PAIRS:
        n, g = medians[nginx], medians[gateway]
        ratio = g[0] / n[0]
        verdict = "met" if ratio >= TARGET else "not met"
        print(f"| {c} × {m} | {label} | {n[0]:,.0f} | {g[0]:,.0f} | {ratio:.2f}× | ≥ {TARGET}× ({verdict}) | {n[2]:.1f} | {g[2]:.1f} | {g[2] / n[2]:.2f}× | {n[1]:.2f} | {g[1]:.2f} |")
