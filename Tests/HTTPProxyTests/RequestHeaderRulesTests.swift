import NIOCore
import NIOHTTP1
import Testing

@testable import HTTPProxy

@Suite("Request header rules")
struct RequestHeaderRulesTests {
    let rules = RequestHeaderRules(identityHeaders: ["X-Auth-User", "X-Auth-Email", "X-Auth-Name", "X-User"], identityPrefix: "X-Auth-")

    func head(_ headers: [(String, String)], version: HTTPVersion = .http1_1) -> HTTPRequestHead {
        HTTPRequestHead(version: version, method: .POST, uri: "/", headers: HTTPHeaders(headers))
    }

    @Test("framing in doubt is rejected", arguments: [
        ("both Content-Length and Transfer-Encoding", [("Host", "a"), ("Content-Length", "3"), ("Transfer-Encoding", "chunked")]),
        ("duplicate Content-Length", [("Host", "a"), ("Content-Length", "3"), ("Content-Length", "3")]),
        ("empty Content-Length", [("Host", "a"), ("Content-Length", "")]),
        ("signed Content-Length", [("Host", "a"), ("Content-Length", "+3")]),
        ("Transfer-Encoding other than chunked", [("Host", "a"), ("Transfer-Encoding", "gzip, chunked")]),
        ("Transfer-Encoding identity", [("Host", "a"), ("Transfer-Encoding", "identity")]),
        ("duplicate Transfer-Encoding", [("Host", "a"), ("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")]),
        ("duplicate Host", [("Host", "a"), ("Host", "b")]),
        ("missing Host in HTTP/1.1", [("Accept", "*/*")]),
        ("Host with a path", [("Host", "a/b")]),
        ("Host with userinfo", [("Host", "user@a")]),
        ("Host a lone dot", [("Host", ".")]),
        ("Host with two colons", [("Host", "a:b:c")]),
        ("Host with a dotted port", [("Host", "example.com.:1.2")]),
        ("Host with an empty label", [("Host", "a..b")]),
    ])
    func framingRejected(name: String, headers: [(String, String)]) {
        let result = rules.inspect(head(headers), peerTrusted: false)
        guard case .failure(.badRequest) = result else {
            Issue.record("\(name) was accepted")
            return
        }
    }

    @Test("Transfer-Encoding in HTTP/1.0 is rejected")
    func transferEncodingHTTP10() {
        guard case .failure = rules.inspect(head([("Transfer-Encoding", "chunked")], version: .http1_0), peerTrusted: false) else {
            Issue.record("accepted")
            return
        }
    }

    @Test("identity headers are removed in every spelling, and everything under the prefix", arguments: [
        "X-Auth-User", "x-auth-user", "X-AUTH-USER", "X_Auth_User", "x_auth-user", "X-Auth_Email", "x-auth-name",
        "X-Auth-Role", "X-Auth-Groups", "x_auth_admin", "X-AUTH-ANYTHING", "X-User", "x_user",
    ])
    func identityStripped(name: String) throws {
        let inbound = try rules.inspect(head([("Host", "a"), (name, "mallory")]), peerTrusted: true).get()
        #expect(!inbound.upstreamHeaders.contains { $0.value == "mallory" })
    }

    @Test("other proxies' identity headers are removed in every spelling, from trusted peers too", arguments: [
        "Remote-User", "remote-user", "REMOTE-USER", "Remote_User", "REMOTE_USER", "remote_user", "Remote-Groups", "remote_groups",
        "Remote-Email", "Remote-Name", "X-Remote-User", "x-remote-user", "X_Remote_User", "X-Remote-Groups", "X-Remote-Email",
        "X-Remote-Name", "X-authentik-username", "X-Authentik-Groups", "X_AUTHENTIK_EMAIL", "X-authentik-uid", "X-authentik-jwt",
        "X-authentik-entitlements", "X-authentik-name", "X-WEBAUTH-USER", "x_webauth_user",
        // oauth2-proxy's: removed as part of X-Forwarded-*.
        "X-Forwarded-User", "X-Forwarded-Email", "X-Forwarded-Groups", "X-Forwarded-Preferred-Username", "x_forwarded_user",
    ])
    func foreignIdentityStripped(name: String) throws {
        // No configured identity names and no prefix: the family does not depend on `identity.*`.
        let bare = RequestHeaderRules(identityHeaders: [])
        for trusted in [false, true] {
            let inbound = try bare.inspect(head([("Host", "a"), (name, "admin"), ("Accept", "*/*")]), peerTrusted: trusted).get()
            #expect(!inbound.upstreamHeaders.contains { $0.value == "admin" }, "\(name), trusted: \(trusted)")
            #expect(inbound.upstreamHeaders["Accept"] == ["*/*"])
        }
    }

    @Test("every name in the always-removed table is removed, as written and in its '_' spelling")
    func foreignIdentityTable() throws {
        let bare = RequestHeaderRules(identityHeaders: [])
        for name in RequestHeaderRules.foreignIdentityNames {
            for spelling in [name, name.uppercased().replacingOccurrences(of: "-", with: "_")] {
                let inbound = try bare.inspect(head([("Host", "a"), (spelling, "admin")]), peerTrusted: true).get()
                #expect(inbound.upstreamHeaders.map(\.name) == ["Host"], "\(spelling)")
            }
        }
    }

    @Test("names that only resemble an identity header pass", arguments: [
        "Remote-Users", "Remote", "Remote-Addr", "X-Remote-Username", "X-Remote", "X-Authentik", "X-WebAuth", "Remote-User-Agent",
    ])
    func lookalikeIdentityPasses(name: String) throws {
        let inbound = try RequestHeaderRules(identityHeaders: []).inspect(head([("Host", "a"), (name, "kept")]), peerTrusted: false).get()
        #expect(inbound.upstreamHeaders[name] == ["kept"])
    }

    @Test("names added by identity.strip_headers are removed like identity headers", arguments: [
        "X-Legacy-User", "x-legacy-user", "X_LEGACY_USER", "X-Employee-Id", "x_employee-id",
    ])
    func configuredStripNames(name: String) throws {
        let rules = RequestHeaderRules(identityHeaders: ["X-Auth-User", "X-Legacy-User", "X_Employee_ID"])
        let inbound = try rules.inspect(head([("Host", "a"), (name, "admin"), ("X-Legacy-Users", "kept")]), peerTrusted: true).get()
        #expect(!inbound.upstreamHeaders.contains { $0.value == "admin" }, "\(name)")
        #expect(inbound.upstreamHeaders["X-Legacy-Users"] == ["kept"])
    }

    @Test("hop-by-hop headers and those named in Connection are removed")
    func hopByHop() throws {
        let inbound = try rules.inspect(head([
            ("Host", "a"), ("Connection", "keep-alive, X-Auth-Other, X-Custom"), ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"), ("Trailer", "x"), ("Proxy-Connection", "keep-alive"), ("Proxy-Authorization", "Basic x"),
            ("Upgrade", "h2c"), ("X-Custom", "named"), ("X-Kept", "yes"),
        ]), peerTrusted: false).get()
        let names = Set(inbound.upstreamHeaders.map { $0.name.lowercased() })
        #expect(names == ["host", "x-kept"])
        #expect(!inbound.isWebSocketUpgrade)
    }

    @Test("a client cannot protect an identity header by naming it in Connection")
    func connectionNamesIdentity() throws {
        let inbound = try rules.inspect(head([("Host", "a"), ("Connection", "X-Auth-User"), ("X-Auth-User", "mallory")]), peerTrusted: false).get()
        #expect(inbound.upstreamHeaders["X-Auth-User"].isEmpty)
    }

    @Test("forwarding headers from untrusted peers are dropped")
    func untrustedForwarding() throws {
        let inbound = try rules.inspect(head([
            ("Host", "a"), ("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "evil"),
            ("Forwarded", "for=1.2.3.4"), ("X-Real-IP", "1.2.3.4"), ("X-Original-URL", "/admin"), ("X-Request-Id", "abc"),
        ]), peerTrusted: false).get()
        #expect(inbound.forwardedFor == nil)
        #expect(inbound.forwardedProto == nil)
        #expect(inbound.requestID == nil)
        #expect(Array(inbound.upstreamHeaders.map(\.name)) == ["Host"])
    }

    @Test("the whole forwarding family, in every spelling, is dropped from untrusted peers", arguments: [
        "X_Forwarded_For", "X_Forwarded_Host", "X_Forwarded_Proto", "X_Real_IP", "X_Original_URL", "x-forwarded_for",
        "X-Forwarded-Uri", "X-Forwarded-Prefix", "X-Forwarded-Ssl", "X-Forwarded-Scheme", "X-Forwarded-Server", "X-Forwarded-Port",
        "X-Forwarded-Path", "X-Client-IP", "True-Client-IP", "X-Original-Host", "X-Original-Method", "X-Envoy-Original-Path",
        "X-Envoy-External-Address", "X-Cluster-Client-IP", "CF-Connecting-IP", "Fastly-Client-IP", "Forwarded", "X-Rewrite-URL",
        "Front-End-Https", "X-Originating-IP",
    ])
    func forwardingFamily(name: String) throws {
        for trusted in [false, true] {
            let inbound = try rules.inspect(head([("Host", "a"), (name, "spoofed"), ("Accept", "*/*")]), peerTrusted: trusted).get()
            #expect(!inbound.upstreamHeaders.contains { $0.value == "spoofed" }, "\(name), trusted: \(trusted)")
            #expect(inbound.forwardedFor == nil && inbound.forwardedProto == nil, "\(name): an underscore spelling is never trusted")
        }
    }

    @Test("spellings with '_' of the headers the proxy interprets are removed, never interpreted", arguments: [
        "Content_Length", "Transfer_Encoding", "X_Request_Id", "Proxy_Connection", "Keep_Alive", "Proxy_Authorization",
    ])
    func lookalikes(name: String) throws {
        let inbound = try rules.inspect(head([("Host", "a"), (name, "5"), ("Accept", "*/*")]), peerTrusted: true).get()
        #expect(!inbound.upstreamHeaders.contains { $0.name == name })
        #expect(inbound.framing == .none, "a lookalike never frames the body")
        #expect(inbound.requestID == nil)
    }

    @Test("Expect: only 100-continue; anything else is 417 (RFC 9110 §10.1.1)", arguments: [
        ("100-continue", true), ("100-Continue", true), (" 100-continue ", true), ("200-ok", false), ("", false), ("100-continue, x", false),
    ])
    func expect(value: String, accepted: Bool) {
        let result = rules.inspect(head([("Host", "a"), ("Expect", value), ("Content-Length", "1")]), peerTrusted: false)
        switch result {
        case .success: #expect(accepted, "\(value) was accepted")
        case .failure(let rejection): #expect(!accepted && rejection == .expectationFailed, "\(value): \(rejection)")
        }
    }

    @Test("several Expect headers: every one must be 100-continue")
    func severalExpect() {
        let result = rules.inspect(head([("Host", "a"), ("Expect", "foo"), ("Expect", "100-continue"), ("Content-Length", "1")]), peerTrusted: false)
        guard case .failure(.expectationFailed) = result else { Issue.record("accepted: \(result)"); return }
    }

    @Test("a bearer credential is noticed in the same pass", arguments: [
        ("Bearer abc", true), ("bearer abc", true), ("  BEARER abc", true), ("Basic abc", false), ("Bearer", false),
    ])
    func bearer(value: String, expected: Bool) throws {
        #expect(try rules.inspect(head([("Host", "a"), ("Authorization", value)]), peerTrusted: false).get().hasBearer == expected)
    }

    @Test("the upstream receives the normalized Host", arguments: [
        ("Secure.Example.Test.", "secure.example.test"), ("a.test.:8080", "a.test:8080"), ("a.test", "a.test"),
    ])
    func normalizedHost(raw: String, sent: String) throws {
        let inbound = try rules.inspect(head([("Host", raw), ("Accept", "*/*")]), peerTrusted: false).get()
        #expect(inbound.upstreamHeaders["host"] == [sent])
        #expect(inbound.host?.authority == sent)
    }

    @Test("forwarding headers from trusted peers are kept for the proxy to extend")
    func trustedForwarding() throws {
        let inbound = try rules.inspect(head([
            ("Host", "a"), ("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-For", "5.6.7.8"), ("X-Forwarded-Proto", "https"),
            ("X-Request-Id", "abc-123"),
        ]), peerTrusted: true).get()
        #expect(inbound.forwardedFor == "1.2.3.4, 5.6.7.8")
        #expect(inbound.forwardedProto == "https")
        #expect(inbound.requestID == "abc-123")
    }

    @Test("keep-alive per HTTP version", arguments: [
        (HTTPVersion.http1_1, [("Host", "a")], true),
        (.http1_1, [("Host", "a"), ("Connection", "close")], false),
        (.http1_0, [], false),
        (.http1_0, [("Connection", "keep-alive")], true),
    ])
    func keepAlive(version: HTTPVersion, headers: [(String, String)], expected: Bool) throws {
        #expect(try rules.inspect(head(headers, version: version), peerTrusted: false).get().keepAlive == expected)
    }

    @Test("a WebSocket handshake keeps exactly its Upgrade and Connection")
    func websocket() throws {
        let inbound = try rules.inspect(head([("Host", "a"), ("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Key", "k")]), peerTrusted: false).get()
        #expect(inbound.isWebSocketUpgrade)
        #expect(inbound.upstreamHeaders["Upgrade"] == ["websocket"])
        #expect(inbound.upstreamHeaders["Connection"] == ["Upgrade"])
    }

    @Test("nothing to strip: the header list passes as is")
    func fastPath() throws {
        let inbound = try rules.inspect(head([("Host", "a"), ("Content-Length", "5"), ("Accept", "*/*")]), peerTrusted: false).get()
        #expect(inbound.upstreamHeaders.count == 3)
        #expect(inbound.framing == .contentLength(5))
    }
}

@Suite("Routing")
struct RouteTableTests {
    @Test("upstream addresses: IP literals need no resolution; names resolve to every address")
    func upstreamAddresses() throws {
        #expect(UpstreamAddress(host: "127.0.0.1", port: 80).socketAddresses.count == 1)
        #expect(UpstreamAddress(host: "::1", port: 80).socketAddresses.count == 1)
        let named = UpstreamAddress(host: "localhost", port: 8080)
        #expect(named.socketAddresses.isEmpty, "a name is not resolved until resolved() is called")
        let resolved = try named.resolved()
        #expect(resolved.socketAddresses.contains { $0.ipAddress == "127.0.0.1" && $0.port == 8080 })
    }

    static let upstream = UpstreamAddress(host: "127.0.0.1", port: 1)
    let table = RouteTable([
        ProxyRoute(name: "root", pathPrefix: "/", upstream: upstream),
        ProxyRoute(name: "api", pathPrefix: "/api", upstream: upstream),
        ProxyRoute(name: "api-v2", pathPrefix: "/api/v2/", upstream: upstream),
        ProxyRoute(name: "admin-host", host: "admin.example.com", pathPrefix: "/", upstream: upstream),
        ProxyRoute(name: "admin-host-static", host: "admin.example.com", pathPrefix: "/static", upstream: upstream),
        ProxyRoute(name: "only-api-host", host: "api.example.com", pathPrefix: "/v1", upstream: upstream),
    ])

    @Test("host first, then the longest prefix on a segment boundary", arguments: [
        ("app.example.com", "/", "root"),
        ("app.example.com", "/api", "api"),
        ("app.example.com", "/api/users", "api"),
        ("app.example.com", "/apix", "root"),
        ("app.example.com", "/api/v2", "api"),
        ("app.example.com", "/api/v2/x", "api-v2"),
        ("admin.example.com", "/api", "admin-host"),
        ("ADMIN.example.com:8443", "/static/a.css", "admin-host-static"),
        ("admin.example.com.", "/api", "admin-host"),
        ("Admin.Example.Com.:80", "/api", "admin-host"),
        ("admin.example.com", "/staticfile", "admin-host"),
        ("api.example.com", "/v1/x", "only-api-host"),
        ("api.example.com", "/v2", nil),
        (nil, "/api", "api"),
    ] as [(String?, String, String?)])
    func routing(host: String?, path: String, expected: String?) throws {
        #expect(table.match(host: try host.map { try RequestHost.parse($0).get() }, path: path)?.name == expected)
    }
}

@Suite("The gateway's cookie is hidden from the upstream")
struct HiddenCookieTests {
    @Test("the upstream cannot set the gateway's cookies", arguments: [
        ("__Host-sessiongate=evil; Path=/; Secure", true),
        ("__Host-sessiongate-login=x; Path=/", true),
        (" __Host-sessiongate =evil", true),
        ("__host-sessiongate=evil; Path=/", true),
        ("__HOST-SESSIONGATE-LOGIN=x", true),
        ("theme=dark; Path=/", false),
        ("__Host-sessiongate-other=x", false),
        ("x__Host-sessiongate=x", false),
    ] as [(String, Bool)])
    func setCookie(value: String, hidden: Bool) {
        #expect(rules.setsHiddenCookie(value) == hidden)
    }

    let rules = RequestHeaderRules(identityHeaders: ["X-Auth-User"], hiddenCookies: ["__Host-sessiongate", "__Host-sessiongate-login"])

    @Test(arguments: [
        ("__Host-sessiongate=abc", nil),
        ("a=1; __Host-sessiongate=abc; b=2", "a=1; b=2"),
        ("__Host-sessiongate=abc;theme=dark", "theme=dark"),
        ("x__Host-sessiongate=abc; y=1", "x__Host-sessiongate=abc; y=1"),
        ("a=__Host-sessiongate=abc", "a=__Host-sessiongate=abc"),
        ("__Host-sessiongate=1; __Host-sessiongate=2", nil),
        ("theme=dark", "theme=dark"),
        ("__Host-sessiongate-login=x; __Host-sessiongate=y; z=1", "z=1"),
    ] as [(String, String?)])
    func cookieHeader(value: String, expected: String?) throws {
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "/", headers: ["Host": "a", "Cookie": value, "Accept": "*/*"])
        let inbound = try rules.inspect(head, peerTrusted: false).get()
        #expect(inbound.upstreamHeaders["cookie"].first == expected)
        #expect(inbound.upstreamHeaders["accept"] == ["*/*"])
    }
}

extension RequestHeaderRules {
    /// The rules over a head given as an `HTTPRequestHead`: written out as bytes and read by the
    /// wire engine, as the proxy receives a request.
    func inspect(_ head: HTTPRequestHead, peerTrusted: Bool) -> Result<InboundRequest, RequestRejection> {
        var text = "\(head.method.rawValue) \(head.uri) HTTP/\(head.version.major).\(head.version.minor)\r\n"
        for (name, value) in head.headers { text += "\(name): \(value)\r\n" }
        var buffer = ByteBuffer(string: text + "\r\n")
        var parser = HeadParser(kind: .request, maxHeadBytes: 1 << 20, maxFields: 1000)
        guard let wire = try? parser.parse(&buffer) else { return .failure(.badRequest("the wire engine refused the head")) }
        return inspect(wire, peerTrusted: peerTrusted)
    }
}
