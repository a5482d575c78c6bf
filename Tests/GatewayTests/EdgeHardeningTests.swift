import Foundation
import GatewayConfig
import HTTPProxy
import NIOCore
import TestSupport
import Testing

/// The holes a red-team replay of peer advisories found at the edge (issue 9), each on a raw
/// socket against a real proxy and a real upstream: the client, the gateway and the app must
/// see the same request.
@Suite("Edge hardening (raw sockets)", .serialized, .timeLimit(.minutes(3)))
struct EdgeHardeningTests {
    /// Answers 401 itself: stands for `auth: required` without a session.
    struct DenyGuard: RequestGuard {
        func admit(_ request: GuardRequest, on eventLoop: any EventLoop) -> GuardDecision {
            .verdict(.respond(.error(.unauthorized, "sign in first")))
        }
    }

    static func hostRoutes(_ upstream: UpstreamAddress) -> [ProxyRoute] {
        [
            ProxyRoute(name: "secure", host: "secure.example.test", pathPrefix: "/", upstream: upstream, requestGuard: DenyGuard()),
            ProxyRoute(name: "public", pathPrefix: "/", upstream: upstream),
        ]
    }

    @Test("a host route's authentication cannot be skipped by spelling the host differently", arguments: [
        "secure.example.test.", "SECURE.example.test", "Secure.Example.Test.:8080", "secure.example.test:80",
    ])
    func hostSpellings(host: String) async throws {
        try await ProxyHarness.with(routes: Self.hostRoutes) { h in
            let response = try await h.request("GET /private HTTP/1.1\r\nHost: \(host)\r\n\r\n")
            #expect(response.status == 401)
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0)
        }
    }

    @Test("malformed hosts are refused with 400 and never routed", arguments: [
        ".", "a:b:c", "example.com.:1.2", "a..b", "[::1", "secure.example.test:", "secure.example.test:99999",
    ])
    func malformedHosts(host: String) async throws {
        try await ProxyHarness.with(routes: Self.hostRoutes) { h in
            let response = try await h.request("GET / HTTP/1.1\r\nHost: \(host)\r\n\r\n")
            #expect(response.status == 400)
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0)
        }
    }

    @Test("the upstream receives the normalized host it was routed by")
    func upstreamHost() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("GET /echo HTTP/1.1\r\nHost: App.Example.TEST.:8080\r\n\r\n")
            #expect(response.status == 200)
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(seen["host"] == ["app.example.test:8080"])
            #expect(seen["x-forwarded-host"] == ["app.example.test:8080"])
        }
    }

    @Test("Transfer-Encoding in any case is re-framed: chunk data never becomes a request", arguments: ["CHUNKED", "Chunked"])
    func transferEncodingCase(spelling: String) async throws {
        try await ProxyHarness.with { h in
            let smuggled = "0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\nX-Auth-User: admin\r\n\r\n"
            let chunk = String(smuggled.utf8.count, radix: 16)
            let response = try await h.request("POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \(spelling)\r\n\r\n\(chunk)\r\n\(smuggled)\r\n0\r\n\r\n")
            #expect(response.status == 200)
            #expect(response.text.contains("body-bytes: \(smuggled.utf8.count)"))
            let stats = h.upstream.stats.withLockedValue { $0 }
            #expect(stats.paths == ["/echo"], "the chunk data must stay a body")
        }
    }

    @Test("request trailers never reach the upstream")
    func trailersDropped() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Auth-User: admin\r\nX-Other: 1\r\n\r\n")
            #expect(response.status == 200)
            let trailers = h.upstream.stats.withLockedValue { $0.lastTrailers }
            #expect(trailers == nil || trailers?.isEmpty == true, "trailers reached the upstream: \(String(describing: trailers))")
            #expect(response.text.contains("body-bytes: 3"))
        }
    }

    @Test("request trailers never reach the upstream, also when they arrive after the body started streaming")
    func trailersDroppedWhileStreaming() async throws {
        try await ProxyHarness.with { h in
            let client = try RawClient(port: h.port, timeoutSeconds: 10)
            // The head reaches the upstream first: the rest streams through an attached connection.
            await h.upstream.waitForArrival(of: "/echo") {
                try? client.send("POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
            }
            let response = try await blocking {
                try client.send("0\r\nX-Auth-User: admin\r\n\r\n")
                return try client.readResponse()
            }
            #expect(response.status == 200)
            let trailers = h.upstream.stats.withLockedValue { $0.lastTrailers }
            #expect(trailers == nil || trailers?.isEmpty == true, "trailers reached the upstream: \(String(describing: trailers))")
        }
    }

    @Test("chunk extensions are bounded: endless framing without body is 400, not a connection held open")
    func chunkExtensionFlood() async throws {
        try await ProxyHarness.with { h in
            let client = try RawClient(port: h.port, timeoutSeconds: 10)
            await h.upstream.waitForArrival(of: "/upload") {
                try? client.send("POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
            }
            let (status, closed) = try await blocking { () -> (Int, Bool) in
                try? client.send("5;" + String(repeating: "a", count: 64 * 1024))
                for _ in 0..<3 { try? client.send(String(repeating: "a", count: 64 * 1024)) }
                return (try client.readResponse().status, client.waitForClose())
            }
            #expect(status == 400)
            #expect(closed)
        }
    }

    @Test("honest chunked bodies pass: many tiny chunks, short extensions, trailers")
    func honestChunks() async throws {
        try await ProxyHarness.with { h in
            let tiny = String(repeating: "1\r\nx\r\n", count: 5000)
            let response = try await h.request("POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\(tiny)5;name=value;q=\"x\"\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n")
            #expect(response.status == 200)
            #expect(response.text.hasPrefix("n=5005"))
        }
    }

    @Test("the upstream cannot set the gateway's cookies")
    func upstreamSetCookie() async throws {
        try await ProxyHarness.with(hiddenCookies: ["__Host-sessiongate", "__Host-sessiongate-login"]) { h in
            let response = try await h.request("GET /setcookie HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 200)
            let cookies = response.headers.filter { $0.0.lowercased() == "set-cookie" }.map(\.1)
            #expect(cookies == ["theme=dark; Path=/"])
        }
    }

    @Test("forwarding headers outside the canonical three, and '_' spellings, never reach the app")
    func forwardingFamily() async throws {
        try await ProxyHarness.with { h in
            let spoofed = ["X_Forwarded_For", "X_Forwarded_Host", "X_Forwarded_Proto", "X_Real_IP", "X_Original_URL", "X-Forwarded-Uri",
                           "X-Forwarded-Prefix", "X-Forwarded-Ssl", "X-Forwarded-Scheme", "X-Forwarded-Server", "X-Client-IP", "True-Client-IP",
                           "X-Original-Host", "X-Envoy-Original-Path", "X-Auth-Role", "X_Auth_Groups"]
            let raw = "GET /echo HTTP/1.1\r\nHost: a\r\n" + spoofed.map { "\($0): spoofed\r\n" }.joined() + "\r\n"
            let response = try await h.request(raw)
            #expect(response.status == 200)
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(!seen.contains { $0.value.contains("spoofed") }, "\(seen.filter { $0.value.contains("spoofed") }.map(\.name))")
            #expect(seen["x-forwarded-for"] == ["127.0.0.1"])
        }
    }

    @Test("other proxies' identity headers never reach the app on a public route, from any peer", arguments: [false, true])
    func foreignIdentityHeaders(trusted: Bool) async throws {
        try await ProxyHarness.with(trustedProxies: trusted ? CIDR.loopback : []) { h in
            let spoofed = ["Remote_User", "remote-user", "REMOTE-GROUPS", "Remote-Email", "Remote_Name", "X-Remote-User", "x_remote_user",
                           "X-authentik-username", "X_AUTHENTIK_GROUPS", "X-WEBAUTH-USER", "X-Forwarded-User", "X-Forwarded-Preferred-Username"]
            let raw = "GET /echo HTTP/1.1\r\nHost: a\r\n" + spoofed.map { "\($0): admin\r\n" }.joined() + "Remote-Users: kept\r\n\r\n"
            let response = try await h.request(raw)
            #expect(response.status == 200)
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(!seen.contains { $0.value == "admin" }, "\(seen.filter { $0.value == "admin" }.map(\.name))")
            #expect(seen["remote-users"] == ["kept"], "a name that only resembles one passes")
        }
    }

    @Test("ambiguous upstream framing is answered 502, never relayed", arguments: [
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nsecret", "ambiguous response framing"),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "ambiguous response framing"),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "ambiguous response framing"),
        ("HTTP/1.1 099 Odd\r\nContent-Length: 5\r\n\r\nhello", "invalid status"),
    ])
    func upstreamFraming(raw: String, reason: String) async throws {
        try await RawUpstream.with(response: raw) { upstream in
            try await ProxyHarness.with(upstreamPort: upstream.port) { h in
                let response = try await h.request("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                #expect(response.status == 502)
                #expect(response.text.contains(reason), "answered by another check: \(response.text)")
                #expect(!response.text.contains("secret") && !response.text.contains("hello"))
            }
        }
    }

    @Test("WebSocket handshakes: foreign origins refused, the request's own host and listed origins admitted")
    func websocketOrigin() async throws {
        try await ProxyHarness.with(hiddenCookies: ["__Host-sessiongate"], origins: OriginPolicy(allowedOrigins: ["https://app.example.com"])) { h in
            let handshake = "GET /ws HTTP/1.1\r\nHost: gw.example.com\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n"
            for origin in ["https://evil.example.com", "null", "https://gw.example.com.evil.org"] {
                let refused = try await h.request(handshake + "Origin: \(origin)\r\n\r\n")
                #expect(refused.status == 403, "\(origin)")
            }
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0)
            for origin in ["https://gw.example.com", "https://app.example.com", nil] as [String?] {
                let admitted = try await h.request(handshake + (origin.map { "Origin: \($0)\r\n" } ?? "") + "\r\n")
                #expect(admitted.status == 101, "\(origin ?? "no origin")")
                #expect(admitted.header("set-cookie") == nil, "the app's 101 may not set the gateway's cookie")
            }
        }
    }

    @Test("a request body trickling in is cut off at server.timeouts.request_body")
    func slowBody() async throws {
        try await ProxyHarness.with(timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(30), idle: .seconds(30), requestBody: .seconds(1))) { h in
            let port = h.port
            let (status, closed) = try await blocking { () -> (Int, Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 20)
                try client.send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nx")
                // One byte every 200 ms: each resets the idle timer, none completes the body. The
                // proxy may cut the connection while we are still sending.
                for _ in 0..<15 {
                    Thread.sleep(forTimeInterval: 0.2)
                    if (try? client.send("x")) == nil { break }
                }
                let response = try client.readResponse()
                return (response.status, client.waitForClose())
            }
            #expect(status == 408)
            #expect(closed)
        }
    }

    @Test("request bodies over the route's max_body_bytes: 413, declared or streamed")
    func bodyLimit() async throws {
        try await ProxyHarness.with(maxBodyBytes: 10) { h in
            let declared = try await h.request("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n01234567890")
            #expect(declared.status == 413)
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0, "a declared oversize body is refused before the upstream")
            let streamed = try await h.request("POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n012345\r\n6\r\n678901\r\n0\r\n\r\n")
            #expect(streamed.status == 413)
            let fits = try await h.request("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n0123456789")
            #expect(fits.status == 200 && fits.text.hasPrefix("n=10"), "\(fits.status) \(fits.text)")
        }
    }

    @Test("TRACE is 405 unless the route opts in; Expect other than 100-continue is 417")
    func traceAndExpect() async throws {
        try await ProxyHarness.with(routes: { upstream in
            [ProxyRoute(name: "diag", pathPrefix: "/diag", upstream: upstream, allowTrace: true), ProxyRoute(name: "app", pathPrefix: "/", upstream: upstream)]
        }) { h in
            let trace = try await h.request("TRACE /echo HTTP/1.1\r\nHost: a\r\nCookie: secret=1\r\n\r\n")
            #expect(trace.status == 405)
            // CONNECT is never a tunnel, whatever its target, and what follows it is not parsed.
            let connect = try await h.request("CONNECT /echo HTTP/1.1\r\nHost: a\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(connect.status == 405)
            #expect(connect.header("connection") == "close")
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0)
            let optedIn = try await h.request("TRACE /diag HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(optedIn.status == 200)
            let expect = try await h.request("POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx")
            #expect(expect.status == 417)
            let continued = try await h.request("POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx")
            #expect(continued.status == 200)
        }
    }

    @Test("bytes that do not parse after complete requests: those are answered first, then 400 and close", arguments: [
        ("a valid request, junk in the same read", "GET /echo HTTP/1.1\r\nHost: a\r\n\r\nJUNK JUNK\r\n\r\n", ["/echo"]),
        // Its turn comes after the first response (a pipelined request is parsed only then, as
        // nginx does): its head may reach the app, its body never completes there.
        ("a pipelined request cut short by junk never completes at the app",
         "GET /slow?ms=200 HTTP/1.1\r\nHost: a\r\n\r\nPOST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n",
         ["/slow?ms=200"]),
    ])
    func junkAfterComplete(_ name: String, raw: String, forwarded: [String]) async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let (statuses, closed) = try await blocking { () -> ([Int], Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 10)
                try client.send(raw)
                let statuses = [try client.readResponse().status, try client.readResponse().status]
                return (statuses, client.waitForClose())
            }
            #expect(statuses == [200, 400], "\(name)")
            #expect(closed)
            #expect(h.upstream.stats.withLockedValue { $0.completed } == forwarded)
        }
    }

    @Test("junk arriving while a response streams: the response completes, then 400 and close")
    func junkDuringResponse() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let (first, length, second, closed) = try await blocking { () -> (Int, Int, Int, Bool) in
                let client = try RawClient(port: port, timeoutSeconds: 10)
                try client.send("GET /download?n=2000000 HTTP/1.1\r\nHost: a\r\n\r\n")
                let head = try client.readResponse(head: true)
                try client.send("JUNK JUNK\r\n\r\n")
                let body = try client.read(count: 2_000_000)
                let b = try client.readResponse()
                return (head.status, body.count, b.status, client.waitForClose())
            }
            #expect(first == 200 && length == 2_000_000)
            #expect(second == 400)
            #expect(closed)
        }
    }
}
