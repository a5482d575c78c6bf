"""Reads bench/tls.sh's wrk outputs: medians per scenario, CPU per request, ratios to nginx."""
import statistics
import sys

import wrkparse

work, connections, reps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
PAIRS = [("keep-alive", "nginx-tls", "sessiongate-tls"), ("new connection per request", "nginx-tls-close", "sessiongate-tls-close")]

print("| c | connections | nginx req/s | sessiongate req/s | req/s vs nginx | nginx CPU µs/req | sessiongate CPU µs/req | CPU vs nginx | sessiongate p99 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for c in connections:
    medians = {}
    for _, *scenarios in PAIRS:
        for s in scenarios:
            runs = []
            for r in range(1, reps + 1):
                w = wrkparse.parse(f"{work}/wrk-{s}-{c}-{r}.txt")
                after, before = map(float, open(f"{work}/cpu-{s}-{c}-{r}.txt").read().split())
                if w["non2xx"]:
                    print(f"WARNING: {s} at c={c}: {w['non2xx']} of {w['total']} responses were not 2xx", file=sys.stderr)
                runs.append((w["rps"], w["p99"], (after - before) / w["total"] * 1e6))
            medians[s] = tuple(statistics.median(run[i] for run in runs) for i in range(3))
    for label, nginx, gateway in PAIRS:
        n, g = medians[nginx], medians[gateway]
        print(f"| {c} | {label} | {n[0]:,.0f} | {g[0]:,.0f} | {g[0] / n[0]:.2f}× | {n[2]:.1f} | {g[2]:.1f} | {g[2] / n[2]:.2f}× | {g[1]:.2f} |")
