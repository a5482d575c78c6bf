#!/usr/bin/env python3
"""The real-browser test: headless Chromium signs in through the Apple ID simulator.

Runs `sessiongate demo` with free ports: the gateway as http://localhost:PORT and the simulator as
http://127.0.0.1:PORT -- two sites, so Apple's form_post callback is a real cross-site POST and
the SameSite=None pre-auth cookie must survive it (a Lax cookie would not). Chromium (Debian
`chromium` + `chromium-driver`) is driven with selenium.

    python3 Tests/browser/sign_in_browser.py .build/debug/sessiongate [OUTPUT_DIR]

It runs twice: over plain HTTP/1.1, then with the gateway terminating TLS (a self-signed
certificate Chromium is told to accept), where Chromium must negotiate HTTP/2 by ALPN for every
page of the gateway (checked with the Navigation Timing API's `nextHopProtocol`).

Saves screenshots of the sign-in page (light and dark) and of the app after sign-in in
OUTPUT_DIR (default .build/browser-test). Exit status 0 when every step passed.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fail(message):
    print(f"browser test FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else ".build/debug/sessiongate"
    out = sys.argv[2] if len(sys.argv) > 2 else ".build/browser-test"
    os.makedirs(out, exist_ok=True)
    run(binary, out, https=False)
    run(binary, os.path.join(out, "https"), https=True)


def run(binary, out, https):
    os.makedirs(out, exist_ok=True)
    gateway, admin, simulator, upstream = (free_port() for _ in range(4))
    work = tempfile.mkdtemp(prefix="sessiongate-browser-")
    config = os.path.join(work, "demo.yaml")
    scheme = "https" if https else "http"
    tls = ""
    if https:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", f"{work}/key.pem", "-out", f"{work}/cert.pem", "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,DNS:other.test"], check=True, capture_output=True)
        tls = f'\n  tls: {{ certificate_file: "{work}/cert.pem", private_key_file: "{work}/key.pem" }}'
    # Over TLS a second routed host on an unrelated domain (other.test, mapped to loopback for
    # Chromium): a sign-in started there must end there (the one-time ticket, issue 39 §1).
    other_route = f"""
  - name: other
    host: "other.test"
    path_prefix: "/"
    upstream: "http://127.0.0.1:{upstream}"
    auth: required""" if https else ""
    with open(config, "w") as f:
        f.write(f"""
server:
  listen: "127.0.0.1:{gateway}"
  public_url: "{scheme}://localhost:{gateway}"
  admin_listen: "127.0.0.1:{admin}"
  access_log: off{tls}
apple:
  team_id: "DEMOTEAM01"
  key_id: "DEMOKEY001"
  client_ids: ["com.example.demo.web"]
  private_key_file: "{work}/AuthKey.p8"
  base_url: "http://127.0.0.1:{simulator}"
routes:{other_route}
  - name: demo
    path_prefix: "/"
    upstream: "http://127.0.0.1:{upstream}"
    auth: required
""")
    process = subprocess.Popen([binary, "demo", "--config", config], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        started = time.time()
        seen = ""
        while "demo is running" not in seen:
            line = process.stdout.readline()
            if not line:
                fail(f"the demo exited: {seen}")
            seen += line
            if time.time() - started > 60:
                fail("the demo did not start within 60 s")

        options = Options()
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,800"):
            options.add_argument(argument)
        if https:
            options.add_argument("--ignore-certificate-errors")
            options.add_argument("--host-resolver-rules=MAP other.test 127.0.0.1")
        options.binary_location = "/usr/bin/chromium"
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        wait = WebDriverWait(driver, 15)
        try:
            origin = f"{scheme}://localhost:{gateway}"
            driver.get(origin + "/reports?year=2026")
            wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "a.siwa")))
            if "/_auth/sign-in" not in driver.current_url:
                fail(f"expected the sign-in page, got {driver.current_url}")
            button = driver.find_element(By.CSS_SELECTOR, "a.siwa")
            if button.get_attribute("aria-label") != "Sign in with Apple":
                fail("the button has no accessible label")
            height = button.size["height"]
            if not 30 <= height <= 64:
                fail(f"button height {height}px is outside Apple's guidelines")
            driver.save_screenshot(os.path.join(out, "sign-in.png"))
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
            driver.save_screenshot(os.path.join(out, "sign-in-dark.png"))
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

            button.click()
            # Apple's side (the simulator, another site): pick the first test user.
            wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "button.user")))
            if not driver.current_url.startswith(f"http://127.0.0.1:{simulator}/auth/authorize"):
                fail(f"expected the simulator's consent page, got {driver.current_url}")
            name = driver.find_element(By.CSS_SELECTOR, "button.user b").text
            driver.find_element(By.CSS_SELECTOR, "button.user").click()
            # The auto-submitting form_post (cross-site) → the gateway → 303 → the app.
            try:
                wait.until(lambda d: d.current_url.startswith(origin + "/reports"))
            except Exception:
                fail(f"sign-in did not return to the app (the cross-site callback lost the pre-auth cookie?): "
                     f"{driver.current_url}: {driver.find_element(By.TAG_NAME, 'body').text[:300]}")
            wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "p.who")))
            page = driver.page_source
            if "Signed in as" not in page:
                fail("the app did not receive an identity: " + driver.find_element(By.TAG_NAME, "body").text[:500])
            first, last = name.split(" ", 1)
            if f"{first}%20{last}" not in page:
                fail(f"X-Auth-Name for {name} not forwarded")
            driver.save_screenshot(os.path.join(out, "signed-in.png"))
            cookies = {c["name"]: c for c in driver.get_cookies()}
            session = cookies.get("__Host-sessiongate")
            if not session or not session.get("httpOnly") or not session.get("secure") or session.get("sameSite") != "Lax":
                fail(f"session cookie attributes: {session}")
            if "__Host-sessiongate-login" in cookies:
                fail("the pre-auth cookie was not cleared")
            protocol = driver.execute_script("return performance.getEntriesByType('navigation')[0].nextHopProtocol")
            if https and protocol != "h2":
                fail(f"Chromium did not negotiate HTTP/2 with the TLS listener: {protocol}")
            if https:
                other_host(driver, wait, origin, f"https://other.test:{gateway}", out)
            print(f"browser test passed ({scheme}, {protocol}): signed in as {name} across sites"
                  f"{' and on a second host' if https else ''}; screenshots in {out}")
        finally:
            driver.quit()
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def other_host(driver, wait, origin, other, out):
    """Signs in on a second routed host (another site than public_url's), through public_url's
    login and Apple, back to the page it started on; signs out there, which ends the session on
    public_url's host too."""
    driver.get(other + "/reports?host=2")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "a.siwa")))
    if not driver.current_url.startswith(other + "/_auth/sign-in"):
        fail(f"expected the sign-in page on the second host, got {driver.current_url}")
    driver.find_element(By.CSS_SELECTOR, "a.siwa").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "button.user")))
    driver.find_element(By.CSS_SELECTOR, "button.user").click()
    try:
        wait.until(lambda d: d.current_url.startswith(other + "/reports?host=2"))
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "p.who")))
    except Exception:
        fail(f"the sign-in started on the second host did not end there: {driver.current_url}: "
             f"{driver.find_element(By.TAG_NAME, 'body').text[:300]}")
    if "Signed in as" not in driver.page_source:
        fail("the second host's app did not receive an identity")
    driver.save_screenshot(os.path.join(out, "signed-in-other-host.png"))
    cookies = {c["name"]: c for c in driver.get_cookies()}
    if "__Host-sessiongate" not in cookies or "__Host-sessiongate-ticket" in cookies:
        fail(f"the second host's cookies after the ticket: {sorted(cookies)}")
    driver.get(other + "/_auth/logout?rd=%2Freports")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "form button")))
    driver.find_element(By.CSS_SELECTOR, "form button").click()
    try:
        wait.until(lambda d: "/_auth/sign-in" in d.current_url)
    except Exception:
        fail(f"signing out on the second host: {driver.current_url}: {driver.find_element(By.TAG_NAME, 'body').text[:300]}")
    driver.get(origin + "/reports?after=logout")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "a.siwa")))
    if "/_auth/sign-in" not in driver.current_url:
        fail(f"signing out on the second host left the session alive on {origin}: {driver.current_url}")


if __name__ == "__main__":
    main()
