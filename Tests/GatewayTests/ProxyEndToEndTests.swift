import TestSupport
import Foundation
import GatewayConfig
import HTTPProxy
import NIOCore
import Testing

/// The data path against a real upstream on loopback.
@Suite("Proxy end to end", .serialized, .timeLimit(.minutes(2)))
struct ProxyEndToEndTests {
    @Test("a request travels to the upstream with forwarding headers and back")
    func roundTrip() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("GET /echo/a/../b?q=1 HTTP/1.1\r\nHost: app.test\r\nX-Forwarded-For: 6.6.6.6\r\nX-Auth-User: mallory\r\nx_auth_email: m@evil\r\n\r\n")
            #expect(response.status == 200)
            #expect(response.text.hasPrefix("GET /echo/b?q=1 HTTP/1.1\n"))
            #expect(response.text.contains("X-Forwarded-For: 127.0.0.1\n"))
            #expect(!response.text.contains("6.6.6.6"))
            #expect(response.text.contains("X-Forwarded-Proto: http\n"))
            #expect(response.text.contains("X-Forwarded-Host: app.test\n"))
            #expect(!response.text.lowercased().contains("mallory"))
            #expect(!response.text.lowercased().contains("m@evil"))
            let requestID = try #require(response.header("x-request-id"))
            #expect(response.text.contains("X-Request-Id: \(requestID)\n"))
        }
    }

    /// Regression: the end of a request answered locally after a *pending* verdict was kept and
    /// replayed into the next request on the connection (an empty body for the gateway's POST
    /// endpoints; a premature end of body towards the upstream).
    @Test("nothing of a locally answered request leaks into the next one on the connection")
    func pendingLocalAnswerThenForward() async throws {
        try await ProxyHarness.with(guard: DenyLaterGuard()) { h in
            let port = h.port
            let (denied, uploaded) = try await blocking {
                let client = try RawClient(port: port, timeoutSeconds: 10)
                try client.send("GET /deny HTTP/1.1\r\nHost: a\r\n\r\n")
                let denied = try client.readResponse()
                try client.send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
                return (denied, try client.readResponse())
            }
            #expect(denied.status == 403)
            #expect(uploaded.status == 200 && uploaded.text.hasPrefix("n=5 "), "\(uploaded.text)")
        }
    }

    @Test("a trusted proxy's X-Forwarded-For is extended, not replaced")
    func trustedProxy() async throws {
        try await ProxyHarness.with(trustedProxies: [CIDR.parse("127.0.0.1/32")!]) { h in
            let response = try await h.request("GET /echo HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Request-Id: trace-1\r\n\r\n")
            #expect(response.text.contains("X-Forwarded-For: 6.6.6.6, 127.0.0.1\n"))
            #expect(response.text.contains("X-Forwarded-Proto: https\n"))
            #expect(response.text.contains("X-Request-Id: trace-1\n"))
        }
    }

    @Test("an upstream named by host name is resolved at load")
    func upstreamByName() async throws {
        try await ProxyHarness.with(upstreamHost: "localhost") { h in
            let response = try await h.request("GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 200)
        }
    }

    @Test("an upstream with several addresses: a refused one is skipped for the next")
    func upstreamAddressFallback() async throws {
        let dead = RefusingPort()
        let refusing = try SocketAddress(ipAddress: "127.0.0.1", port: dead.port)
        try await ProxyHarness.with(extraAddressesFirst: [refusing]) { h in
            let response = try await h.request("GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 200)
            withExtendedLifetime(dead) {}
        }
    }

    @Test("keep-alive: consecutive requests reuse one upstream connection (plain and https upstream)", arguments: [false, true])
    func keepAliveReuse(tls: Bool) async throws {
        try await ProxyHarness.with(upstreamTLS: tls) { h in
            let port = h.port
            let statuses = try await blocking {
                let c = try RawClient(port: port)
                var statuses: [Int] = []
                for i in 0..<5 {
                    try c.send("GET /echo/\(i) HTTP/1.1\r\nHost: a\r\n\r\n")
                    statuses.append(try c.readResponse().status)
                }
                return statuses
            }
            #expect(statuses == [200, 200, 200, 200, 200])
            #expect(h.upstream.stats.withLockedValue { $0.connections } == 1)
        }
    }

    @Test("pipelined requests are answered in order")
    func pipelining() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let bodies = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET /echo/1 HTTP/1.1\r\nHost: a\r\n\r\nGET /slow?ms=50 HTTP/1.1\r\nHost: a\r\n\r\nPOST /echo/3 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /nowhere%2f HTTP/1.1\r\nHost: a\r\n\r\n")
                return try (0..<4).map { _ in try c.readResponse() }
            }
            #expect(bodies[0].text.hasPrefix("GET /echo/1 "))
            #expect(bodies[1].text == "slow done")
            #expect(bodies[2].text.hasPrefix("POST /echo/3 "))
            #expect(bodies[2].text.contains("body-bytes: 5"))
            #expect(bodies[3].status == 400)
        }
    }

    @Test("HTTP/1.0: closed after the response unless keep-alive was asked for (plain and https upstream)", arguments: [false, true])
    func http10(tls: Bool) async throws {
        try await ProxyHarness.with(upstreamTLS: tls) { h in
            let port = h.port
            let (first, closed, second, keptOpen) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET /download?n=100&chunked HTTP/1.0\r\n\r\n")
                let first = try c.readResponse()
                let closed = c.waitForClose()
                let k = try RawClient(port: port, timeoutSeconds: 1)
                try k.send("GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                let second = try k.readResponse()
                let keptOpen = !k.waitForClose()
                return (first, closed, second, keptOpen)
            }
            #expect(first.status == 200)
            #expect(first.body.count == 100)
            #expect(first.header("transfer-encoding") == nil, "no chunked framing to an HTTP/1.0 client")
            #expect(closed)
            #expect(second.header("connection") == "keep-alive")
            #expect(keptOpen)
        }
    }

    @Test("a client that half-closes after its request still gets the whole response")
    func halfClose() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let (response, closed) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET /slow?ms=100 HTTP/1.1\r\nHost: a\r\n\r\n")
                shutdown(c.fd, Int32(SHUT_WR))
                return (try c.readResponse(), c.waitForClose())
            }
            #expect(response.text == "slow done")
            #expect(response.header("connection") == "close")
            #expect(closed)
        }
    }

    @Test("HEAD responses carry no body and do not desynchronize the connection")
    func headRequests() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let (head, next) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("HEAD /download?n=5000&chunked HTTP/1.1\r\nHost: a\r\n\r\nGET /echo/after HTTP/1.1\r\nHost: a\r\n\r\n")
                return (try c.readResponse(head: true), try c.readResponse())
            }
            #expect(head.status == 200)
            #expect(next.text.hasPrefix("GET /echo/after "))
        }
    }

    @Test("no route: 404; bad target: 400 and the upstream sees nothing")
    func localErrors() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("GET /public/%2e%2e%2fadmin HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 400)
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0)
        }
    }

    @Test("refused upstream: 502 quickly, and the connection stays usable")
    func refused() async throws {
        let dead = RefusingPort()
        try await ProxyHarness.with(upstreamPort: dead.port) { h in
            let port = h.port
            let (first, second) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                let first = try c.readResponse()
                try c.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                return (first, try c.readResponse())
            }
            #expect(first.status == 502)
            #expect(first.text.contains("refused"))
            #expect(second.status == 502)
            withExtendedLifetime(dead) {}
        }
    }

    @Test("upstream response timeout: 504 (plain and https upstream)", arguments: [false, true])
    func responseTimeout(tls: Bool) async throws {
        try await ProxyHarness.with(timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .milliseconds(300), idle: .seconds(10)), upstreamTLS: tls) { h in
            let response = try await h.request("GET /hang HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 504)
            #expect(response.text.contains("did not respond in time"))
        }
    }

    @Test("upstream connect timeout: 504")
    func connectTimeout() async throws {
        // A listener with a full accept queue never completes the handshake of another SYN.
        let (listener, blackhole) = boundLoopbackSocket()
        defer { close(listener) }
        listen(listener, 0)
        var fillers: [RawClient] = []
        for _ in 0..<3 { if let f = try? RawClient(port: blackhole, timeoutSeconds: 1) { fillers.append(f) } }
        try await ProxyHarness.with(timeouts: .init(upstreamConnect: .milliseconds(300), upstreamResponse: .seconds(5), idle: .seconds(10)), upstreamPort: blackhole) { h in
            let response = try await h.request("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 504)
            withExtendedLifetime(fillers) {}
        }
    }

    @Test("idle keep-alive connections are closed after the idle timeout")
    func idleTimeout() async throws {
        // A second of idle, which the exchange itself must fit in: proxy and app on loops of
        // their own, so no other test's traffic sits between them (on the shared loops the
        // exchange ran past one second, then three, in full runs: a 504, not the close).
        try await withEventLoops(1) { loops in
            try await ProxyHarness.with(timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .seconds(1)), group: loops) { h in
                let port = h.port
                let (status, closed) = try await blocking {
                    let c = try RawClient(port: port, timeoutSeconds: 15)
                    try c.send("GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
                    let status = try c.readResponse().status
                    return (status, c.waitForClose())
                }
                #expect(status == 200)
                #expect(closed)
            }
        }
    }

    @Test("a transfer that stalls past the idle timeout is aborted (upstream silent mid-body)")
    func stalledDownload() async throws {
        // 300 ms of idle, which the response head must arrive within: proxy and app on loops of
        // their own (on the shared loops a full run once answered 504 before the head).
        try await withEventLoops(1) { loops in
            try await ProxyHarness.with(timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .milliseconds(300)), group: loops) { h in
                let port = h.port
                // The response head has arrived, so only the idle timeout can end this exchange.
                let outcome = try await blocking { () -> String in
                    let c = try RawClient(port: port, timeoutSeconds: 15)
                    try c.send("GET /stall HTTP/1.1\r\nHost: a\r\n\r\n")
                    do { _ = try c.readResponse(); return "complete" } catch RawClient.Failure.closed { return "aborted" }
                }
                #expect(outcome == "aborted")
            }
        }
    }

    @Test("a request body that stalls past the idle timeout gets 504 and the connection closes")
    func stalledUpload() async throws {
        try await ProxyHarness.with(timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .milliseconds(300))) { h in
            let port = h.port
            let (status, closed) = try await blocking {
                let c = try RawClient(port: port, timeoutSeconds: 5)
                try c.send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
                return (try c.readResponse().status, c.waitForClose())
            }
            #expect(status == 504)
            #expect(closed)
        }
    }

    @Test("an upstream reset mid-response aborts the client connection")
    func resetMidResponse() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let outcome = try await blocking { () -> String in
                let c = try RawClient(port: port)
                try c.send("GET /reset HTTP/1.1\r\nHost: a\r\n\r\n")
                do {
                    let r = try c.readResponse()
                    return "complete response of \(r.body.count) bytes"
                } catch RawClient.Failure.closed {
                    return "aborted"
                }
            }
            #expect(outcome == "aborted")
        }
    }

    @Test("idempotent requests are retried once when a pooled connection was closed before answering (plain and https upstream)", arguments: [false, true])
    func retryOnStaleConnection(tls: Bool) async throws {
        try await ProxyHarness.with(upstreamTLS: tls) { h in
            let port = h.port
            let (first, retried, post) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET /flaky HTTP/1.1\r\nHost: a\r\n\r\n")
                let first = try c.readResponse()
                try c.send("GET /flaky HTTP/1.1\r\nHost: a\r\n\r\n")
                let retried = try c.readResponse()
                // The retry's connection is pooled now, so this POST goes out on a reused one too.
                try c.send("POST /flaky HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
                return (first, retried, try c.readResponse())
            }
            #expect(first.text == "flaky ok")
            #expect(retried.text == "flaky ok")
            #expect(post.status == 502, "a POST is never retried")
            #expect(h.upstream.stats.withLockedValue { $0.connections } == 2)
        }
    }

    @Test("WebSocket upgrade passes bytes both ways until a side closes (plain and https upstream)", arguments: [false, true])
    func websocket(tls: Bool) async throws {
        try await ProxyHarness.with(upstreamTLS: tls) { h in
            let port = h.port
            let (status, echoed, closed) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
                let response = try c.readResponse()
                try c.send("ping-1")
                let first = try c.read(count: 6)
                try c.send("ping-2")
                let second = try c.read(count: 6)
                shutdown(c.fd, Int32(SHUT_WR))
                return (response.status, String(decoding: first + second, as: UTF8.self), c.waitForClose())
            }
            #expect(status == 101)
            #expect(echoed == "ping-1ping-2")
            #expect(closed)
        }
    }

    @Test("bytes the client sends in the same packet as its handshake reach the app through the tunnel")
    func websocketEarlyBytes() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let (status, echoed) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nearly!")
                let response = try c.readResponse()
                return (response.status, String(decoding: try c.read(count: 6), as: UTF8.self))
            }
            #expect(status == 101)
            #expect(echoed == "early!", "the wire engine read them with the handshake: they must go into the tunnel, not be lost")
        }
    }

    @Test("a 101 to a request that asked for no upgrade is a 502, never a tunnel")
    func unaskedSwitch() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("GET /switch HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.status == 502)
            #expect(response.text.contains("switched protocols unasked"))
        }
    }

    @Test("interim 1xx responses are passed on before the final one")
    func interimResponses() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("GET /continue HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(response.interim == [100])
            #expect(response.status == 200)
            #expect(response.text == "after interim")
        }
    }

    @Test("h2c upgrade requests are not upgraded")
    func h2cIsNotUpgraded() async throws {
        try await ProxyHarness.with { h in
            let response = try await h.request("GET /echo HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
            #expect(response.status == 200)
            #expect(!response.text.lowercased().contains("upgrade"))
            #expect(!response.text.lowercased().contains("http2-settings"))
        }
    }

    @Test("large bodies stream both ways")
    func streaming() async throws {
        try await ProxyHarness.with { h in
            let port = h.port
            let size = 32 * 1024 * 1024
            let (upload, downloaded, chunkedDownloaded) = try await blocking {
                let c = try RawClient(port: port)
                try c.send("POST /upload?sum HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
                let block = [UInt8](repeating: UInt8(ascii: "y"), count: 1 << 20)
                for _ in 0..<(size >> 20) {
                    try c.send(Array("100000\r\n".utf8) + block + Array("\r\n".utf8))
                }
                try c.send("0\r\n\r\n")
                let upload = try c.readResponse()
                try c.send("GET /download?n=\(size) HTTP/1.1\r\nHost: a\r\n\r\n")
                let down = try c.readResponse(discardBody: false).body.count
                try c.send("GET /download?n=\(size)&chunked HTTP/1.1\r\nHost: a\r\n\r\n")
                let chunked = try c.readResponse().body.count
                return (upload, down, chunked)
            }
            var expectedSum: UInt32 = 0
            for _ in 0..<size { expectedSum = expectedSum &* 31 &+ UInt32(UInt8(ascii: "y")) }
            #expect(upload.text == "n=\(size) sum=\(expectedSum)")
            #expect(downloaded == size)
            #expect(chunkedDownloaded == size)
        }
    }
}

#if canImport(Glibc)
import Glibc
#endif

/// Answers `/deny` with 403 a moment later (a pending verdict); forwards everything else.
struct DenyLaterGuard: RequestGuard {
    func admit(_ request: GuardRequest, on loop: any EventLoop) -> GuardDecision {
        guard request.target.path == "/deny" else { return .verdict(.forward) }
        return .pending(loop.scheduleTask(in: .milliseconds(50)) { Verdict.respond(.error(.forbidden, "no")) }.futureResult)
    }
}
