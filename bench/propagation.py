"""Revocation propagation between two instances: for each of N users, POST /_auth/revoke on
instance A with one of the user's sessions, then poll instance B with another of the user's
sessions (already in B's cache) until B refuses it. Reports p50/p99/max of the delay from A's
answer to B's first refusal.

    python3 bench/propagation.py URL_A URL_B COOKIES_FILE N USERS
"""
import http.client
import statistics
import sys
import time
from urllib.parse import urlparse

url_a, url_b, cookies_file, n, users = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cookies = open(cookies_file).read().split()


def connect(url):
    u = urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=10)


a, b = connect(url_a), connect(url_b)


def request(conn, method, path, cookie):
    conn.request(method, path, headers={"Cookie": f"__Host-sessiongate={cookie}", "Accept": "application/json"})
    response = conn.getresponse()
    response.read()
    return response.status


delays = []
for i in range(n):
    revoke_with, watched = cookies[i], cookies[i + users]  # the same user (seed.py: session k belongs to user k % USERS)
    assert request(b, "GET", "/", watched) == 200, "B must admit the session first"
    assert request(a, "POST", "/_auth/revoke", revoke_with) == 204
    answered = time.perf_counter()
    while request(b, "GET", "/", watched) == 200:
        if time.perf_counter() - answered > 5:
            raise SystemExit(f"B still admits a revoked user after 5 s (revocation {i})")
    delays.append((time.perf_counter() - answered) * 1000)

delays.sort()
p99 = delays[min(len(delays) - 1, int(len(delays) * 0.99))]
print(f"Revocation propagation A → B over {n} revocations (from A's answer to B's first refusal, polling B back to back): "
      f"p50 {statistics.median(delays):.2f} ms, p99 {p99:.2f} ms, max {delays[-1]:.2f} ms.")
