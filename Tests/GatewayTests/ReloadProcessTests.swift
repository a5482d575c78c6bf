import AppleIDSimulator
import Crypto
import Foundation
import HTTPProxy
import NIOHTTP1
import Testing
import TestSupport

/// SIGHUP against the real binary: every reloadable key takes effect for new requests as one
/// value, spoofed identity headers never pass under the old or the new names, and a file that
/// changes a restart-only key is refused as a whole (issue 10 §1).
@Suite("SIGHUP reload (process)", .serialized, .timeLimit(.minutes(3)))
struct ReloadProcessTests {
    /// The reloadable settings the test moves; everything else stays as written.
    struct Settings {
        var listen = "127.0.0.1:0"
        var publicURL: String
        var authPrefix = "/_auth"
        var trustedProxies: [String] = []
        var redirectHosts: [String] = []
        var origins: [String] = []
        var maxBodyBytes = 0
        var shutdown = "2s"
        var scopes = ["name", "email"]
        var idle = "1h"
        var absolute = "30d"
        var headers: [String: String] = [:]
        var headerPrefix = "X-Auth-"
        var stripHeaders: [String] = []
        var assertionTTL = "60s"
        var staffUsers: [String] = []
        var extraRoute = false
        var keyPrefix = "sg:"
    }

    static func yaml(_ s: Settings, directory: String, simulator: String, upstream: Int) -> String {
        func list(_ items: [String]) -> String { "[" + items.map { "\"\($0)\"" }.joined(separator: ", ") + "]" }
        var text = """
            server:
              listen: "\(s.listen)"
              admin_listen: "127.0.0.1:0"
              public_url: "\(s.publicURL)"
              auth_prefix: "\(s.authPrefix)"
              trusted_proxies: \(list(s.trustedProxies))
              allowed_redirect_hosts: \(list(s.redirectHosts))
              allowed_origins: \(list(s.origins))
              access_log: "off"
              timeouts:
                shutdown: "\(s.shutdown)"
              limits:
                max_body_bytes: \(s.maxBodyBytes)
            apple:
              team_id: "TEAM123456"
              client_ids: ["\(SignInHarness.webClient)"]
              key_id: "KEY1234567"
              private_key_file: "\(directory)/AuthKey.p8"
              base_url: "\(simulator)"
              scopes: \(list(s.scopes))
            session:
              secret_file: "\(directory)/session.key"
              idle_timeout: "\(s.idle)"
              absolute_timeout: "\(s.absolute)"
            store:
              key_prefix: "\(s.keyPrefix)"
            identity:
              header_prefix: "\(s.headerPrefix)"
              strip_headers: \(list(s.stripHeaders))
              assertion:
                enabled: true
                key_file: "\(directory)/assertion.pem"
                ttl: "\(s.assertionTTL)"

            """
        if !s.headers.isEmpty {
            text += "  headers:\n" + s.headers.sorted { $0.key < $1.key }.map { "    \($0.key): \"\($0.value)\"\n" }.joined()
        }
        text += """
            routes:
              - name: api
                path_prefix: /api/
                upstream: "http://127.0.0.1:\(upstream)"
                unauthenticated: deny
              - name: public
                path_prefix: /public/
                upstream: "http://127.0.0.1:\(upstream)"
                auth: public
              - name: staff
                path_prefix: /staff/
                upstream: "http://127.0.0.1:\(upstream)"

            """
        if !s.staffUsers.isEmpty { text += "    allow:\n      users: \(list(s.staffUsers))\n" }
        if s.extraRoute {
            text += "  - name: extra\n    path_prefix: /extra/\n    upstream: \"http://127.0.0.1:\(upstream)\"\n    auth: public\n"
        }
        text += "  - name: app\n    path_prefix: /\n    upstream: \"http://127.0.0.1:\(upstream)\"\n"
        return text
    }

    /// The claims of a compact JWS, as JSON text.
    static func claims(_ token: String) -> [String: Any] {
        var part = String(token.split(separator: ".")[1]).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while part.count % 4 != 0 { part += "=" }
        return (try? JSONSerialization.jsonObject(with: Data(base64Encoded: part) ?? Data())) as? [String: Any] ?? [:]
    }

    @Test("every reloadable key applies at once for new requests; old and new identity header names are never spoofable")
    func everyReloadableKey() async throws {
        let directory = try makeSecretsDirectory("reload")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let appleKey = try P256.Signing.PrivateKey(pemRepresentation: String(contentsOfFile: directory + "/AuthKey.p8", encoding: .utf8))
        let reserved = ReservedPort()
        defer { withExtendedLifetime(reserved) {} }
        let port = reserved.port
        let origin = "http://localhost:\(port)"
        try await withTeardown(SimulatedAppleID.start(team: .init(
            teamID: "TEAM123456", keys: ["KEY1234567": appleKey.publicKey],
            clients: [SignInHarness.webClient: [origin + "/_auth/callback"]], allowsLoopbackHTTP: true)), stop: { await $0.stop() }) { simulator in
            let alice = simulator.createUser(email: "alice@example.org", privateEmail: false, firstName: "Alice", lastName: "A")
            try await TestUpstream.with { upstream in
                let render = { (s: Settings) in Self.yaml(s, directory: directory, simulator: simulator.baseURL, upstream: upstream.port) }

                var settings = Settings(publicURL: origin)
                settings.listen = "127.0.0.1:\(port)"
                try await GatewayProcess.with(yaml: render(settings)) { gateway in
                    let admin = try await gateway.ports().admin
                    let browser = TestBrowser(gatewayOrigin: origin)
                    _ = try await browser.signIn(from: "/api/x", as: alice)

                    func upstreamHeaders(_ path: String, _ extra: [(String, String)] = [], by who: TestBrowser? = nil) async throws -> (Int, HTTPHeaders) {
                        let response = try await (who ?? browser).request(path, headers: [("accept", "application/json")] + extra)
                        return (response.status, upstream.stats.withLockedValue { $0.lastHeaders })
                    }
                    let spoofs = [("X-Auth-User", "admin"), ("X-User", "admin"), ("X-Auth-Email", "evil@example.com"), ("X-Mail", "evil@example.com"),
                                  ("X_Auth_User", "admin"), ("X-Gw-Role", "admin"), ("X-Legacy-User", "admin"), ("Remote_User", "admin")]

                    // Before: the default names, spoofs stripped under them.
                    var (status, seen) = try await upstreamHeaders("/api/who", spoofs)
                    #expect(status == 200)
                    #expect(seen["X-Auth-User"] == [alice])
                    #expect(seen["X-Auth-Email"] == ["alice@example.org"])
                    #expect(seen["X-User"] == ["admin"], "not yet an identity header")
                    #expect(seen["X-Gw-Role"] == ["admin"], "not yet under the identity prefix")
                    #expect(seen["X-Legacy-User"] == ["admin"], "not yet in identity.strip_headers")
                    #expect(seen["Remote_User"].isEmpty && seen["Remote-User"].isEmpty, "another proxy's identity header: always removed")
                    let firstAssertion = try #require(seen.first(name: "X-Auth-Assertion"))
                    let firstClaims = Self.claims(firstAssertion)
                    #expect((firstClaims["exp"] as? Int).map { $0 - (firstClaims["iat"] as? Int ?? 0) } == 60)
                    #expect(try await browser.request("/staff/x").status == 200)
                    #expect(try await browser.request("/api/upload", method: .POST, headers: [("accept", "application/json")], form: [("a", String(repeating: "x", count: 40))]).status == 200)
                    let anonymous = TestBrowser(gatewayOrigin: origin)
                    #expect(try await anonymous.request("/extra/x").status == 302, "no such route yet: the app route wants a session")
                    let login = try await anonymous.request("/_auth/login?rd=/")
                    #expect(login.location?.contains("scope=name%20email") == true, "\(login.location ?? "")")
                    #expect(try await anonymous.request("/_auth/sign-in?rd=https://docs.example.com/x").body.contains("docs.example.com") == false)
                    #expect(try await anonymous.request("/_auth/logout", method: .POST, headers: [("origin", "https://other.example.com")]).status == 403)
                    (_, seen) = try await upstreamHeaders("/public/x", [("X-Forwarded-For", "192.0.2.7")], by: anonymous)
                    #expect(seen["X-Forwarded-For"] == ["127.0.0.1"], "an untrusted peer's X-Forwarded-For is replaced")

                    // Reload B: every identity header renamed, lists, limits, lifetimes.
                    settings.headers = ["user": "X-User", "email": "X-Mail", "email_verified": "X-Mail-Verified", "private_email": "X-Mail-Private",
                                        "email_forwarding": "X-Mail-Forwarding", "name": "X-Name", "real_user_status": "X-Real", "assertion": "X-Proof"]
                    settings.trustedProxies = ["127.0.0.1/32"]
                    settings.stripHeaders = ["X-Legacy-User"]
                    settings.redirectHosts = ["docs.example.com"]
                    settings.origins = ["https://other.example.com"]
                    settings.maxBodyBytes = 10
                    settings.scopes = ["email"]
                    settings.absolute = "7d"
                    settings.assertionTTL = "120s"
                    settings.staffUsers = ["someone.else"]
                    settings.extraRoute = true
                    #expect(try await gateway.reload(yaml: render(settings))?.contains("configuration reloaded") == true)

                    // The session signed in before the reload: new names at once, spoofs under old and new names stripped.
                    (status, seen) = try await upstreamHeaders("/api/who", spoofs)
                    #expect(status == 200)
                    #expect(seen["X-User"] == [alice])
                    #expect(seen["X-Mail"] == ["alice@example.org"])
                    #expect(seen["X-Mail-Verified"] == ["true"])
                    #expect(seen["X-Name"] == ["Alice%20A"], "\(seen)")
                    #expect(seen["X-Auth-User"].isEmpty && seen["X_Auth_User"].isEmpty && seen["X-Auth-Email"].isEmpty, "old names: stripped (identity prefix)")
                    #expect(seen["X-Auth-Assertion"].isEmpty)
                    #expect(seen["X-Legacy-User"].isEmpty, "identity.strip_headers applies at once")
                    #expect(seen["Remote_User"].isEmpty && seen["Remote-User"].isEmpty)
                    let assertion = try #require(seen.first(name: "X-Proof"))
                    let claims = Self.claims(assertion)
                    #expect((claims["exp"] as? Int).map { $0 - (claims["iat"] as? Int ?? 0) } == 120)
                    #expect(try await browser.request("/staff/x").status == 403, "the allow list changed")
                    #expect(try await browser.request("/api/upload", method: .POST, headers: [("accept", "application/json")], form: [("a", String(repeating: "x", count: 40))]).status == 413)
                    #expect(try await anonymous.request("/extra/x").status == 200, "the new route")
                    let redirected = try await anonymous.request("/x")
                    #expect(redirected.status == 302 && redirected.location?.hasPrefix("/_auth/sign-in?rd=") == true, "\(redirected.location ?? "")")
                    let login2 = try await anonymous.request("/_auth/login?rd=/")
                    #expect(login2.location?.contains("scope=email&") == true || login2.location?.hasSuffix("scope=email") == true, "\(login2.location ?? "")")
                    #expect(login2.location?.contains("redirect_uri=\(FormBody.escape(origin + "/_auth/callback"))") == true, "\(login2.location ?? "")")
                    #expect(try await anonymous.request("/_auth/sign-in?rd=https://docs.example.com/x").body.contains("docs.example.com"))
                    #expect(try await anonymous.request("/_auth/logout", method: .POST, headers: [("origin", "https://other.example.com")]).status != 403)
                    (_, seen) = try await upstreamHeaders("/public/x", [("X-Forwarded-For", "192.0.2.7")], by: anonymous)
                    #expect(seen["X-Forwarded-For"] == ["192.0.2.7, 127.0.0.1"], "a trusted peer's X-Forwarded-For is kept")
                    // A sign-in completes with the new lifetime.
                    let second = TestBrowser(gatewayOrigin: origin)
                    _ = try await second.signIn(from: "/api/y", as: alice, prefix: "/_auth")
                    #expect(second.setCookies.contains { $0.hasPrefix("__Host-sessiongate=") && $0.contains("Max-Age=604800") }, "\(second.setCookies)")
                    #expect(try await second.request("/api/y", headers: [("accept", "application/json")]).status == 200)

                    // Reload C: another identity prefix.
                    settings.headerPrefix = "X-Gw-"
                    #expect(try await gateway.reload(yaml: render(settings))?.contains("configuration reloaded") == true)
                    (status, seen) = try await upstreamHeaders("/api/who", spoofs)
                    #expect(status == 200)
                    #expect(seen["X-Gw-Role"].isEmpty, "the new identity prefix strips")
                    #expect(seen["X-User"] == [alice])
                    // Reload D changes restart-only keys beside a reloadable one: refused as a whole.
                    var refused = settings
                    refused.listen = "127.0.0.1:\(port + 1)"
                    refused.keyPrefix = "other:"
                    refused.publicURL = "http://127.0.0.1:\(port)"  // Apple's return URL would move
                    refused.headers["email"] = "X-Refused-Mail"
                    let text = render(refused)
                    let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
                    let listenLine = try #require(lines.firstIndex { $0.hasPrefix("  listen:") }) + 1
                    let prefixLine = try #require(lines.firstIndex { $0.hasPrefix("  key_prefix:") }) + 1
                    let publicURLLine = try #require(lines.firstIndex { $0.hasPrefix("  public_url:") }) + 1
                    for attempt in 1...2 {
                        let mark = gateway.output.count
                        #expect(try await gateway.reload(yaml: text)?.contains("configuration reload refused") == true)
                        let logged = gateway.output.dropFirst(mark)
                        #expect(logged.contains { $0.contains("\(gateway.configPath):\(listenLine):3: error: server.listen: changes only at restart") }, "attempt \(attempt): \(logged)")
                        #expect(logged.contains { $0.contains("\(gateway.configPath):\(prefixLine):3: error: store.key_prefix: changes only at restart") })
                        #expect(logged.contains { $0.contains("\(gateway.configPath):\(publicURLLine):3: error: server.public_url: changes only at restart; "
                            + "the reload is refused and the running configuration stays: it moves the return URL registered at Apple") })
                        #expect(!logged.contains { $0.contains("identity.headers") }, "only restart-only keys are named")
                    }
                    _ = try await browser.request("/api/who", headers: [("accept", "application/json"), ("X-Refused-Mail", "evil")])
                    seen = upstream.stats.withLockedValue { $0.lastHeaders }
                    #expect(seen["X-Mail"] == ["alice@example.org"], "nothing of the refused file applied")
                    #expect(seen["X-Refused-Mail"] == ["evil"])
                    let metrics = try await blocking {
                        let c = try RawClient(port: admin)
                        try c.send("GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
                        return try c.readResponse().text
                    }
                    #expect(metrics.contains(#"sessiongate_config_reloads_total{result="ok"} 2"#))
                    #expect(metrics.contains(#"sessiongate_config_reloads_total{result="refused"} 2"#))
                    #expect(metrics.contains(#"sessiongate_config_reloads_total{result="invalid"} 0"#))

                    // A secret replaced in place is read only at start: the reload says so instead of
                    // pretending to apply it; put back, the same file reloads again.
                    let secretPath = directory + "/session.key"
                    let original = try Data(contentsOf: URL(fileURLWithPath: secretPath))
                    try Data(String(repeating: "r", count: 64).utf8).write(to: URL(fileURLWithPath: secretPath))
                    let mark = gateway.output.count
                    #expect(try await gateway.reload(yaml: render(settings))?.contains("configuration reload refused") == true)
                    #expect(gateway.output.dropFirst(mark).contains { $0.contains("error: session.secret_file: \(secretPath): the content changed") }, "\(gateway.output.dropFirst(mark))")
                    try original.write(to: URL(fileURLWithPath: secretPath))

                    // Reload E: idle lifetime and drain deadline. Under idle_timeout 2s a session unused for
                    // longer has ended (nothing to await but time); under 1h it was live.
                    settings.idle = "2s"
                    settings.shutdown = "7s"
                    #expect(try await gateway.reload(yaml: render(settings))?.contains("configuration reloaded") == true)
                    try await Task.sleep(for: .seconds(3))
                    #expect(try await second.request("/api/y", headers: [("accept", "application/json")]).status == 401)

                    let drained = gateway.output.count
                    gateway.signal(SIGTERM)
                    #expect(await gateway.waitForLine(containing: "shutting down", after: drained)?.contains("deadline=7s") == true)
                    #expect(await gateway.waitForExit() == 0)
                }
            }
        }
    }
}

