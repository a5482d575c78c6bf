"""Reads the wrk outputs of bench/run.sh and prints a Markdown table of medians and ratios."""
import statistics
import sys

import wrkparse

work, connections, reps, rss_kb, duration = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]


def parse(path):
    w = wrkparse.parse(path)
    return w["rps"], w["p50"], w["p99"], w["non2xx"]


def cpu_per_request(name, c, r, requests):
    """µs of CPU per request spent by the proxy under test (sessiongate's process; for nginx,
    its worker minus what the same worker spends per request serving the upstream directly)."""
    sg_after, sg_before, ng_after, ng_before = map(float, open(f"{work}/cpu-{name}-{c}-{r}.txt").read().split())
    if name == "sessiongate":
        return (sg_after - sg_before) / requests * 1e6
    return (ng_after - ng_before) / requests * 1e6


def total_requests(path):
    return wrkparse.parse(path)["total"]


print("| c | target | req/s (median) | p50 ms | p99 ms | CPU µs/req | req/s vs nginx | p99 − nginx p99 | CPU vs nginx |")
print("|---|---|---|---|---|---|---|---|---|")
for c in connections:
    medians = {}
    for name in ["direct", "nginx", "sessiongate"]:
        runs = []
        for r in range(1, reps + 1):
            path = f"{work}/wrk-{name}-{c}-{r}.txt"
            rps, p50, p99, errors = parse(path)
            if errors:
                print(f"WARNING: {name} at c={c} returned {errors} non-2xx responses", file=sys.stderr)
            runs.append((rps, p50, p99, cpu_per_request(name, c, r, total_requests(path))))
        medians[name] = tuple(statistics.median(run[i] for run in runs) for i in range(4))
    # nginx's own share: its worker's CPU per proxied request minus its CPU per direct request.
    nginx_cpu = medians["nginx"][3] - medians["direct"][3]
    medians["nginx"] = medians["nginx"][:3] + (nginx_cpu,)
    nginx_rps, _, nginx_p99, _ = medians["nginx"]
    for name, (rps, p50, p99, cpu) in medians.items():
        ratio = f"{rps / nginx_rps:.2f}×" if name != "direct" else "—"
        delta = f"{p99 - nginx_p99:+.2f} ms" if name == "sessiongate" else "—"
        cpu_text = f"{cpu:.1f}" if name != "direct" else "—"
        cpu_ratio = f"{cpu / nginx_cpu:.2f}×" if name == "sessiongate" else "—"
        print(f"| {c} | {name} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {cpu_text} | {ratio} | {delta} | {cpu_ratio} |")
print()
print(f"sessiongate peak RSS over the whole run: {rss_kb / 1024:.0f} MiB")
