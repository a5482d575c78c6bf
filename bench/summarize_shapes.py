"""Reads bench/shapes.sh's wrk outputs: medians per scenario, the ratio to nginx measured the same
way, errors and the TIME_WAIT peak."""
import statistics
import sys

import wrkparse

work, reps, measured = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
ROWS = [("nginx-6", "nginx-6", reps, "—"), ("one-user-6", "nginx-6", reps, "≥ 0.85×"), ("one-user-6-b", "nginx-6", reps, "BIN_B"),
        ("nginx-50", "nginx-50", reps, "—"), ("one-user-50", "nginx-50", reps, "≥ 0.85×"), ("one-user-50-b", "nginx-50", reps, "BIN_B"),
        ("nginx-lb", "nginx-lb", 1, "—"), ("lb", "nginx-lb", 1, "0 errors, TIME_WAIT ≪ port range"),
        ("lb-echo", "nginx-lb", 1, "≥ 0.7×, 0 errors")]
ROWS = [row for row in ROWS if row[0] in measured]

medians = {}
for name, _, n, _ in ROWS:
    runs = []
    for r in range(1, n + 1):
        w = wrkparse.parse(f"{work}/wrk-{name}-{r}.txt")
        after, before = map(float, open(f"{work}/cpu-{name}-{r}.txt").read().split())
        peak = int(open(f"{work}/tw-{name}-{r}.txt").read().strip() or 0)
        runs.append((w["rps"], w["p99"], (after - before) / max(w["total"], 1) * 1e6, w["non2xx"], w["socket_errors"], peak, w["total"]))
    medians[name] = tuple(statistics.median(run[i] for run in runs) for i in range(3)) + tuple(sum(run[i] for run in runs) for i in (3, 4, 6)) \
        + (max(run[5] for run in runs),)

print("| scenario | req/s (median) | p99 ms | CPU µs/req | requests | non-2xx | socket errors | TIME_WAIT peak | vs nginx | target |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, base, _, target in ROWS:
    rps, p99, cpu, non2xx, errors, total, peak = medians[name]
    ratio = "—" if name == base else f"{rps / medians[base][0]:.2f}×"
    waiting = f"{peak:,}" if "lb" in name else "—"  # the one-user app is on loopback
    print(f"| {name} | {rps:,.0f} | {p99:.2f} | {cpu:.1f} | {total:,} | {non2xx:,} | {errors:,} | {waiting} | {ratio} | {target} |")
