import GatewayConfig
import HTTPProxy
import NIOCore
import NIOPosix
import TestSupport
import Testing

/// Users never mix (issue 23): an app's framing mistake on a kept-alive upstream connection
/// reaches only the principal who caused it. Two clients on **one event loop** (so they share
/// its one pool), a `MisbehavingUpstream` that leaves bytes on its connection, and the second
/// client must never receive a byte of the first's.
@Suite("Upstream connections and users (raw bytes)", .serialized)
struct UpstreamIsolationTests {
    /// Admits a request as the user its `X-Test-User` names (a session, as far as the proxy can
    /// tell), or anonymously without one.
    struct HeaderGuard: RequestGuard {
        func admit(_ request: GuardRequest, on eventLoop: any EventLoop) -> GuardDecision {
            guard let user = request.firstValue(named: "x-test-user") else { return .verdict(.forward) }
            return .verdict(.forward(addHeaders: [("X-Auth-User", user)], user: user))
        }
    }

    struct Shape: CustomTestStringConvertible, Sendable {
        let name: String
        /// What the first client (alice, or anonymous) sends.
        let first: String
        let firstIsHead: Bool
        /// Whether `shared` mode still lets the second client see the first's bytes.
        let leaksWhenShared: Bool
        var testDescription: String { name }
    }

    static let shapes: [Shape] = [
        Shape(name: "a late extra response", first: "GET /late-extra HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n",
              firstIsHead: false, leaksWhenShared: true),
        Shape(name: "a late HEAD body", first: "HEAD /head HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n",
              firstIsHead: true, leaksWhenShared: false),
        Shape(name: "a late 204 body", first: "GET /no-content HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n",
              firstIsHead: false, leaksWhenShared: false),
        Shape(name: "a late 304 body", first: "GET /not-modified HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n",
              firstIsHead: false, leaksWhenShared: false),
        Shape(name: "a body longer than its Content-Length", first: "GET /over-long HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n",
              firstIsHead: false, leaksWhenShared: false),
        Shape(name: "an anonymous body the app does not read (CL.0)",
              first: "POST /static/x HTTP/1.1\r\nHost: a\r\nContent-Length: 45\r\n\r\nGET /forged?to=attacker HTTP/1.1\r\nX-Swallow: ",
              firstIsHead: false, leaksWhenShared: true),
        Shape(name: "an anonymous body the app does not read, spelling out a whole request as admin (CL.0)",
              first: "POST /static/x HTTP/1.1\r\nHost: a\r\nContent-Length: \(forged.utf8.count)\r\n\r\n\(forged)",
              firstIsHead: false, leaksWhenShared: true),
    ]

    /// A request the attacker writes whole, identity included, as a body.
    static let forged = "GET /forged-admin HTTP/1.1\r\nHost: a\r\nX-Auth-User: admin\r\n\r\n"

    struct Outcome {
        /// What the second client (admin) received as the answer to its `GET /b`.
        let second: RawClient.Response?
        /// Every request line the app parsed with admin's identity.
        let adminLines: [String]
    }

    /// A proxy on one event loop (so its one pool) in front of a `MisbehavingUpstream`, with one
    /// route of `reuse` whose guard is `HeaderGuard`; `trustingLoopback`: the clients are a
    /// trusted front proxy. `body` gets the proxy's port and the app.
    static func withProxy<T: Sendable>(reuse: GatewayConfiguration.UpstreamReuse, trustingLoopback: Bool = false,
                                       _ body: (Int, MisbehavingUpstream) async throws -> T) async throws -> T {
        try await withEventLoops(1) { group in
            try await MisbehavingUpstream.with(group: MultiThreadedEventLoopGroup.singleton) { app in
                try await ProxyHarness.with(trustedProxies: trustingLoopback ? [CIDR.parse("127.0.0.1/32")!] : [], upstreamPort: app.port, group: group,
                                            routes: { address in [ProxyRoute(name: "app", upstream: address, requestGuard: HeaderGuard(), upstreamReuse: reuse)] }) { h in
                    try await body(h.port, app)
                }
            }
        }
    }

    /// alice (or an anonymous client) sends `shape.first` on one connection and reads its answer;
    /// then admin sends `GET /b` on another connection of the same event loop.
    static func run(_ shape: Shape, reuse: GatewayConfiguration.UpstreamReuse) async throws -> Outcome {
        try await Self.withProxy(reuse: reuse) { port, app in
            let second = try await blocking { () -> RawClient.Response? in
                let first = try RawClient(port: port, timeoutSeconds: 5)
                try first.send(shape.first)
                _ = try first.readResponse(head: shape.firstIsHead)
                let admin = try RawClient(port: port, timeoutSeconds: 5)
                try admin.send("GET /b HTTP/1.1\r\nHost: a\r\nX-Test-User: admin\r\n\r\n")
                return try? admin.readResponse()
            }
            return Outcome(second: second, adminLines: app.requests.filter { $0.user == "admin" }.map { $0.line })
        }
    }

    @Test("principal (the default): the second user gets their own answer, never a byte of the first's", arguments: shapes)
    func principal(_ shape: Shape) async throws {
        let outcome = try await Self.run(shape, reuse: .principal)
        let second = try #require(outcome.second)
        #expect(second.status == 200)
        #expect(second.text == "line=GET /b HTTP/1.1;user=admin")
        #expect(!second.text.contains("alice"))
        #expect(outcome.adminLines == ["GET /b HTTP/1.1"], "the app ran only admin's own request as admin")
    }

    /// `echo` shares connections across users, so a late response can land on the next user's
    /// request — where it does not carry that request's `X-Request-Id`, and is refused.
    @Test("echo: the second user gets their own answer or a 502, never a byte of the first's, and the app never runs a forged request", arguments: shapes)
    func echo(_ shape: Shape) async throws {
        let outcome = try await Self.run(shape, reuse: .echo)
        let second = try #require(outcome.second)
        #expect(!second.text.contains("alice"))
        if second.status == 200 {
            #expect(second.text == "line=GET /b HTTP/1.1;user=admin")
        } else {
            #expect(second.status == 502 && shape.leaksWhenShared, "refused only where shared would have leaked: \(second.status)")
            #expect(second.text.contains("X-Request-Id"))
        }
        #expect(outcome.adminLines == ["GET /b HTTP/1.1"], "the app ran only admin's own request as admin")
    }

    @Test("echo: many users' requests through one front-proxy connection share one upstream connection; each carries the gateway's own fresh id, not the proxy's")
    func echoSharesThroughAProxy() async throws {
        try await Self.withProxy(reuse: .echo, trustingLoopback: true) { port, app in
            let answers = try await blocking { () -> [RawClient.Response] in
                let front = try RawClient(port: port, timeoutSeconds: 5)
                return try (0..<20).map { i in
                    try front.send("GET /b HTTP/1.1\r\nHost: a\r\nX-Test-User: user\(i)\r\nX-Request-Id: lb-\(i)\r\n\r\n")
                    return try front.readResponse()
                }
            }
            #expect(answers.enumerated().allSatisfy { i, answer in answer.status == 200 && answer.text == "line=GET /b HTTP/1.1;user=user\(i)" })
            #expect(app.connections == 1, "one upstream connection for twenty users")
            let ids = app.requestIDs.compactMap { $0 }
            #expect(ids.count == 20 && Set(ids).count == 20, "a fresh id per request")
            #expect(!ids.contains { $0.hasPrefix("lb-") }, "never the proxy's (predictable) id")
            #expect(answers.map { $0.header("x-request-id") } == ids, "the client sees the id the app echoed")
        }
    }

    @Test("echo: an app that does not echo X-Request-Id is refused 502, its connection closed, for every request")
    func echoRefusesSilentApps() async throws {
        try await Self.withProxy(reuse: .echo) { port, app in
            let statuses = try await blocking { () -> [Int] in
                let client = try RawClient(port: port, timeoutSeconds: 5)
                return try (0..<3).map { _ in
                    try client.send("GET /no-echo HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n")
                    return try client.readResponse().status
                }
            }
            #expect(statuses == [502, 502, 502])
            #expect(app.connections == 3, "each refused response's connection was closed")
        }
    }

    @Test("echo: an interim response that does not echo the request's id is dropped, the final one relayed; other modes relay it", arguments: [GatewayConfiguration.UpstreamReuse.echo, .principal])
    func echoDropsUnechoedInterims(reuse: GatewayConfiguration.UpstreamReuse) async throws {
        try await Self.withProxy(reuse: reuse) { port, app in
            let response = try await blocking { () -> RawClient.Response in
                let client = try RawClient(port: port, timeoutSeconds: 5)
                try client.send("GET /early-hints HTTP/1.1\r\nHost: a\r\nX-Test-User: alice\r\n\r\n")
                return try client.readResponse()
            }
            #expect(response.status == 200 && response.text == "hints")
            #expect(response.interim == (reuse == .echo ? [] : [103]))
        }
    }

    @Test("none: every request has a connection of its own", arguments: shapes)
    func none(_ shape: Shape) async throws {
        let outcome = try await Self.run(shape, reuse: .none)
        #expect(outcome.second?.text == "line=GET /b HTTP/1.1;user=admin")
        #expect(outcome.adminLines == ["GET /b HTTP/1.1"])
    }

    @Test("principal: anonymous requests through a trusted proxy (whose connection carries many clients) each get a connection of their own")
    func anonymousThroughProxy() async throws {
        try await Self.withProxy(reuse: .principal, trustingLoopback: true) { port, app in
            let second = try await blocking { () -> RawClient.Response in
                // One front-proxy connection: anonymous user X's request, then anonymous user Y's.
                let front = try RawClient(port: port, timeoutSeconds: 5)
                try front.send("GET /late-extra HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.1\r\n\r\n")
                _ = try front.readResponse()
                try front.send("GET /b HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.2\r\n\r\n")
                return try front.readResponse()
            }
            #expect(second.text == "line=GET /b HTTP/1.1;user=-")
        }
    }

    /// What `shared` still lets through, written down: a connection is not reused after a
    /// response whose framing is in doubt (a bodyless response announcing a body, bytes right
    /// behind a response), but bytes an app sends late after a well-framed response, and a body
    /// it never read, reach whoever takes the connection next.
    @Test("shared: what it stops and what it still lets through", arguments: shapes)
    func shared(_ shape: Shape) async throws {
        let outcome = try await Self.run(shape, reuse: .shared)
        let leaked = outcome.second?.text.contains("alice") == true || outcome.adminLines.contains { $0.contains("/forged") }
        #expect(leaked == shape.leaksWhenShared)
    }

    @Test("a body spelling out a whole request never runs, in principal, echo and none modes", arguments: [GatewayConfiguration.UpstreamReuse.principal, .echo, .none])
    func forgedRequestInABody(reuse: GatewayConfiguration.UpstreamReuse) async throws {
        let outcome = try await Self.run(Self.shapes.last!, reuse: reuse)
        #expect(!outcome.adminLines.contains { $0.contains("/forged") })
    }
}
