"""Reads bench/auth.sh's wrk outputs: medians per scenario and ratios to nginx proxy_pass."""
import statistics
import sys

import wrkparse

work, connections, reps, scenarios = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4].split()
EXPECTED = {"nginx": "2xx", "cached": "2xx", "shared": "2xx", "redis": "2xx", "redis-shared": "2xx", "no-cookie": "401", "forged": "401",
            "nginx-browser": "2xx", "browser": "2xx", "browser-shared": "2xx"}
# The browser-like rows are compared with nginx measured the same way (a thread per connection).
BASELINE = {"browser": "nginx-browser", "browser-shared": "nginx-browser", "nginx-browser": "nginx-browser"}


def parse(path):
    w = wrkparse.parse(path)
    return w["rps"], w["p99"], w["total"], w["non2xx"]


print("| c | scenario | answer | req/s (median) | p99 ms | CPU µs/req | req/s vs nginx | target |")
print("|---|---|---|---|---|---|---|---|")
targets = {"cached": "≥ 1.0×", "redis": "≥ 0.8×", "forged": "≥ 2×", "browser": "≥ 0.95 × browser-shared", "shared": "≥ redis-shared"}
for c in connections:
    medians = {}
    for s in scenarios:
        runs = []
        for r in range(1, reps + 1):
            rps, p99, total, non2xx = parse(f"{work}/wrk-{s}-{c}-{r}.txt")
            after, before = map(float, open(f"{work}/cpu-{s}-{c}-{r}.txt").read().split())
            wanted_non2xx = total if EXPECTED[s] == "401" else 0
            if non2xx != wanted_non2xx:
                print(f"WARNING: {s} at c={c}: {non2xx} of {total} responses were not {EXPECTED[s]}", file=sys.stderr)
            runs.append((rps, p99, (after - before) / total * 1e6))
        medians[s] = tuple(statistics.median(run[i] for run in runs) for i in range(3))
    for s in scenarios:
        rps, p99, cpu = medians[s]
        base = BASELINE.get(s, "nginx")
        ratio = f"{rps / medians[base][0]:.2f}×" + ("" if base == "nginx" else f" ({base})") if base in medians else "—"
        print(f"| {c} | {s} | {EXPECTED[s]} | {rps:,.0f} | {p99:.2f} | {cpu:.1f} | {ratio} | {targets.get(s, '—')} |")
