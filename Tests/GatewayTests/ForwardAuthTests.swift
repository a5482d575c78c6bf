import GatewayConfig
import Foundation
@testable import Gateway
@testable import HTTPProxy
import NIOCore
import NIOPosix
import NIOHTTP1
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `conf/nginx-forward-auth.conf` and `conf/Caddyfile.forward-auth` as shipped (ports replaced):
/// the front proxy asks SessionGate's `/_auth/check` for every request and passes the identity on
/// to the app. Both must behave alike: identity passed, spoofed headers replaced, anonymous and
/// forged browsers sent to sign in, API and XHR calls answered 401, nothing reaching the app, and
/// the app receiving exactly the identity headers `/_auth/check` answered with: none it left out
/// (not empty, not Caddy's placeholder text), none of another proxy's.
@Suite("forward-auth: nginx and Caddy in front of the app", .serialized, .timeLimit(.minutes(2)))
struct ForwardAuthTests {
    @Test("the shipped nginx and Caddy configs pass on every identity header and no other spelling reaches the app")
    func configsNameEveryIdentityHeader() throws {
        let nginx = try String(contentsOfFile: "\(repositoryRoot)/conf/nginx-forward-auth.conf", encoding: .utf8)
        let caddy = try String(contentsOfFile: "\(repositoryRoot)/conf/Caddyfile.forward-auth", encoding: .utf8)
        for name in IdentityHeaderNames().all {
            // nginx cannot strip by prefix: each name must be overwritten with /_auth/check's value.
            #expect(nginx.contains("proxy_set_header \(name) $"), "nginx does not replace \(name): a client could send it")
            #expect(caddy.contains(" \(name)"), "Caddy does not copy \(name)")
            // Caddy before 2.9 sets a listed header the check left out to the placeholder's text.
            let removesPlaceholder = caddy.contains("header_regexp \(name) ^\\{http\\.reverse_proxy\\.header\\.")
            #expect(removesPlaceholder, "Caddy does not remove \(name) when the check left it out")
        }
    }

    @Test func nginxForwardAuth() async throws {
        try await SignInHarness.with { h in
            let nginxPort = try closedPort()
            let directory = NSTemporaryDirectory() + "nginx-\(UUID().uuidString)"
            try FileManager.default.createDirectory(atPath: directory + "/logs", withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let example = try String(contentsOfFile: "\(repositoryRoot)/conf/nginx-forward-auth.conf", encoding: .utf8)
                .replacingOccurrences(of: "127.0.0.1:8080", with: "127.0.0.1:\(h.gatewayPort)")
                .replacingOccurrences(of: "127.0.0.1:9000", with: "127.0.0.1:\(h.upstream.port)")
                .replacingOccurrences(of: "listen 80;", with: "listen 127.0.0.1:\(nginxPort);")
            try """
                daemon on;
                pid \(directory)/nginx.pid;
                error_log \(directory)/error.log warn;
                events { worker_connections 64; }
                http {
                  access_log off;
                  \(example)
                }
                """.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
            // nginx daemonizes: the command returns once it listens.
            let status = try await blocking { runToCompletion("/usr/sbin/nginx", ["-c", directory + "/nginx.conf", "-p", directory]) }
            try #require(status == 0, "nginx did not start: \((try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? "")")
            defer {
                if let pid = (try? String(contentsOfFile: directory + "/nginx.pid", encoding: .utf8)).flatMap({ Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) {
                    kill(pid, SIGTERM)
                }
            }
            // nginx cannot remove headers by prefix: only the configured names are replaced.
            try await Self.exercise(h, front: "http://127.0.0.1:\(nginxPort)", stripsPrefix: false)
        }
    }

    @Test func caddyForwardAuth() async throws {
        try await SignInHarness.with { h in
            let caddyPort = try closedPort()
            let directory = NSTemporaryDirectory() + "caddy-\(UUID().uuidString)"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let example = try String(contentsOfFile: "\(repositoryRoot)/conf/Caddyfile.forward-auth", encoding: .utf8)
                .replacingOccurrences(of: "127.0.0.1:8080", with: "127.0.0.1:\(h.gatewayPort)")
                .replacingOccurrences(of: "127.0.0.1:9000", with: "127.0.0.1:\(h.upstream.port)")
                .replacingOccurrences(of: ":80 {", with: "http://127.0.0.1:\(caddyPort) {")
            // No admin API (its port may be taken), no state outside the test's directory.
            try "{\n\tadmin off\n}\n\n\(example)".write(toFile: directory + "/Caddyfile", atomically: true, encoding: .utf8)
            try await GatewayProcess.with(arguments: ["run", "--config", directory + "/Caddyfile", "--adapter", "caddyfile"], executable: "/usr/bin/caddy",
                                           environment: ["HOME": directory, "XDG_DATA_HOME": directory, "XDG_CONFIG_HOME": directory]) { caddy in
                try #require(await caddy.waitForLine(containing: "serving initial configuration") != nil, "caddy did not start: \(caddy.output)")
                try await Self.exercise(h, front: "http://127.0.0.1:\(caddyPort)", stripsPrefix: true)
            }
        }
    }

    /// The same requests through either front proxy.
    static func exercise(_ h: SignInHarness, front: String, stripsPrefix: Bool) async throws {
        // A session (native sign-in straight at the gateway), then requests through the front.
        let sub = h.simulator.createUser()
        let app = TestBrowser(gatewayOrigin: h.origin)
        let credential = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: "n")
        let signedIn = try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(credential.identityToken)","authorization_code":"\#(credential.authorizationCode)","nonce":"n","user":{"name":{"firstName":"Ada","lastName":"L"}}}"#)
        let token = try #require((try JSONSerialization.jsonObject(with: Data(signedIn.body.utf8)) as? [String: Any])?["token"] as? String)
        let browser = TestBrowser(gatewayOrigin: front)
        let html = ("accept", "text/html,application/xhtml+xml")
        // What the gateway answers for this session: the user has no link, and neither an email
        // forwarding state nor an assertion, so some identity headers are left out.
        let check = try await TestBrowser(gatewayOrigin: h.origin).request("/_auth/check", headers: [html, ("cookie", "__Host-sessiongate=\(token)")])
        #expect(check.status == 200 && check.headers["x-auth-user"] == [sub])
        #expect(check.headers["x-auth-account"].isEmpty, "an unlinked user")

        // The client's values under every identity name (the unlinked user's X-Auth-Account
        // too), and under other proxies' identity names in two spellings.
        let spoofs = [("X-Auth-Email", "spoof@example.com"), ("X-Auth-Account", "spoof"), ("X-Auth-Email-Forwarding", "spoof"),
                      ("X-Auth-Role", "admin"), ("X_Auth_User", "admin")]
        let foreign = RequestHeaderRules.foreignIdentityNames.enumerated().map { index, name in
            (index % 2 == 0 ? name : name.replacingOccurrences(of: "-", with: "_"), "foreign")
        }
        let admitted = try await browser.request("/reports", headers: [html, ("cookie", "__Host-sessiongate=\(token)")] + spoofs + foreign)
        #expect(admitted.status == 200)
        let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
        #expect(seen["x-auth-user"] == [sub] && seen["x-auth-name"] == ["Ada%20L"], "\(seen)")
        for name in IdentityHeaderNames().all {
            // Exactly the check's answer: a header it left out is absent, not empty, not a placeholder.
            #expect(seen[name] == check.headers[name], "\(name): the app got \(seen[name]), the check answered \(check.headers[name])")
        }
        #expect(!seen.contains { $0.value.contains("{http.") }, "a front proxy's placeholder text reached the app: \(seen)")
        #expect(!seen.contains { $0.value == "foreign" }, "another proxy's identity header reached the app: \(seen.filter { $0.value == "foreign" }.map(\.name))")
        #expect(seen["x_auth_user"].isEmpty, "an underscore spelling never passes: \(seen)")
        if stripsPrefix { #expect(seen["x-auth-role"].isEmpty, "a name under the identity prefix never passes: \(seen)") }

        let before = h.upstream.stats.withLockedValue { $0.requests }
        let anonymous = try await browser.request("/reports?q=1", headers: [html, ("X-Auth-User", "admin")])
        #expect(anonymous.status == 302 && anonymous.location?.hasSuffix("/_auth/sign-in?rd=%2Freports%3Fq%3D1") == true, "\(anonymous.status) \(anonymous.location ?? "")")
        let forged = try await browser.request("/reports", headers: [html, ("cookie", "__Host-sessiongate=\(String(repeating: "A", count: 86))")])
        #expect(forged.status == 302)
        for (name, headers) in [("API", [("accept", "application/json")]), ("XHR", [html, ("x-requested-with", "XMLHttpRequest")]),
                                ("fetch", [("accept", "*/*")])] as [(String, [(String, String)])] {
            let denied = try await browser.request("/api/items", headers: headers + [("X-Auth-User", "admin")])
            #expect(denied.status == 401, "\(name): \(denied.status)")
            #expect(denied.location == nil)
        }
        let post = try await browser.request("/reports", method: .POST, headers: [html], form: [("a", "b")])
        #expect(post.status == 401, "a form POST is not redirected (its body would be lost)")
        #expect(h.upstream.stats.withLockedValue { $0.requests } == before, "nothing unauthenticated reached the app")
        let page = try await browser.request("/_auth/sign-in?rd=/reports")
        #expect(page.status == 200 && page.body.contains("Sign in with Apple"))
    }
}

/// What the access log says of `/_auth/check` (issue 28 §2): who the check admitted and which
/// request the front proxy asked about, the latter only as a trusted proxy tells it.
@Suite("forward-auth: the access log's who and what")
struct ForwardAuthLogTests {
    static func check(_ h: SignInHarness, cookies: [String: String], trusted: [String]) async throws -> LocalResponse {
        let (configuration, auth) = h.service.running.withLockedValue { ($0.configuration, $0.auth) }
        let endpoints = AuthEndpointGuard(auth: auth, origins: GatewayService.origins(configuration), trustedProxies: trusted.compactMap(CIDR.parse))
        var headers = HTTPHeaders([("host", "localhost"), ("x-original-method", "POST"), ("x-original-uri", "/orders/7?draft=1")])
        if !cookies.isEmpty { headers.add(name: "cookie", value: cookies.map { "\($0.key)=\($0.value)" }.joined(separator: "; ")) }
        let request = GuardRequest(head: HTTPRequestHead(version: .http1_1, method: .GET, uri: "/_auth/check", headers: headers),
                                   target: RequestTarget(path: "/_auth/check", query: nil), routeName: "auth",
                                   clientAddress: try SocketAddress(ipAddress: "127.0.0.1", port: 40000))
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let verdict: Verdict
        switch endpoints.admit(request, on: loop) {
        case .verdict(let v): verdict = v
        case .pending(let future): verdict = try await future.get()
        }
        guard case .respond(let response) = verdict else { throw ForwardAuthLogFailure() }
        return response
    }

    struct ForwardAuthLogFailure: Error {}

    @Test("a check names the user it admitted and, from a trusted front proxy, the original request without its query")
    func subject() async throws {
        try await SignInHarness.with { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            let sub = h.simulator.createUser()
            _ = try await browser.signIn(from: "/x", as: sub)
            let admitted = try await Self.check(h, cookies: browser.cookies, trusted: ["127.0.0.1/32"])
            #expect(admitted.status == .ok)
            #expect(admitted.subject == LocalResponse.LoggedSubject(user: sub, original: "POST /orders/7"))
            let untrusted = try await Self.check(h, cookies: browser.cookies, trusted: [])
            #expect(untrusted.subject == LocalResponse.LoggedSubject(user: sub, original: nil), "anyone could write any URI into the log")
            let anonymous = try await Self.check(h, cookies: [:], trusted: ["127.0.0.1/32"])
            #expect(anonymous.status == .unauthorized)
            #expect(anonymous.subject == LocalResponse.LoggedSubject(user: nil, original: "POST /orders/7"))
        }
    }
}
