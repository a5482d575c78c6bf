"""Creates N real sessions through the product: test users at the Apple ID simulator, then for
each session the native flow (the simulator's /sim/native stands in for AuthenticationServices;
the gateway's POST /_auth/native verifies and exchanges). Writes one token per line.

    python3 bench/seed.py SIMULATOR_URL GATEWAY_URL SESSIONS USERS OUT_FILE

Session k belongs to user k % USERS. The gateway allows `apple.exchanges_per_minute` sign-ins per
user (default 30; over it, 429): configure it for more sessions per user than that.
"""
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

simulator, gateway, sessions, users, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise SystemExit(f"{url}: {error.code} {error.read()[:300]!r}")


subs = [post(f"{simulator}/sim/users", {"first_name": f"User{i}", "last_name": "Bench"})["sub"] for i in range(users)]


def sign_in(i):
    sub = subs[i % users]
    nonce = f"bench-{i}"
    credential = post(f"{simulator}/sim/native", {"sub": sub, "client_id": "com.example.app", "nonce": nonce})
    answer = post(f"{gateway}/_auth/native", {"identity_token": credential["identity_token"],
                                               "authorization_code": credential["authorization_code"], "nonce": nonce})
    return answer["token"]


with ThreadPoolExecutor(max_workers=8) as pool:
    tokens = list(pool.map(sign_in, range(sessions)))
assert len(set(tokens)) == sessions, "tokens are not distinct"
with open(out, "w") as f:
    f.write("\n".join(tokens) + "\n")
print(f"{sessions} sessions for {users} users")
