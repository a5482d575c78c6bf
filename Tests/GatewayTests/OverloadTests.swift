import GatewayConfig
import HTTPProxy
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Bounded connections and overload (issue 23 §2), on raw sockets: a head that trickles in is
/// cut at `request_head`, connections over a cap are refused at once, and a route with
/// `max_in_flight` sheds at once; a normal client is served meanwhile.
@Suite("Bounded connections and overload (raw sockets)", .serialized)
struct OverloadTests {
    /// What the proxy reports about refusals and sheds (the metrics' source).
    final class Refusals: ProxyObserver, Sendable {
        let counts = NIOLockedValueBox<(refused: [ConnectionRefusal], shed: Int)>(([], 0))
        var wantsRequestDetails: Bool { false }
        func exchangeCompleted(_ record: ExchangeRecord) {}
        func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { if kind == .maxInFlight { counts.withLockedValue { $0.shed += 1 } } }
        func clientConnectionRefused(_ reason: ConnectionRefusal) { counts.withLockedValue { $0.refused.append(reason) } }
        func clientConnectionOpened() {}
        func clientConnectionClosed() {}
        func upstreamConnectionOpened(_ upstream: UpstreamAddress) {}
        func upstreamConnectionClosed() {}
    }

    /// An app that accepts connections and never answers.
    final class SilentUpstream: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

        static func start(group: any EventLoopGroup) async throws -> any Channel {
            try await ServerBootstrap(group: group)
                .serverChannelOption(.backlog, value: 4096)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(SilentUpstream()) }
                }
                .bind(host: "127.0.0.1", port: 0).get()
        }
    }

    /// request_head of one second, an idle timeout (20 s) far beyond it.
    static let headInOneSecond = ProxyConfiguration.Timeouts(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .seconds(20),
                                                             requestHead: .seconds(1))

    @Test("150 clients trickling header lines, one every 0.3 s, are each answered 408 at request_head and closed, though each line is activity")
    func trickledHeads() async throws {
        try await ProxyHarness.with(timeouts: Self.headInOneSecond) { h in
            let port = h.port
            let (statuses, elapsed) = try await blocking { () -> ([Int], Double) in
                let start = NIODeadline.now()
                let clients = try (0..<150).map { _ in try RawClient(port: port, timeoutSeconds: 10) }
                for client in clients { try client.send("GET / HTTP/1.1\r\nHost: a\r\n") }
                // Trickle for well past request_head (the idle timeout, 20 s, would never fire).
                for round in 0..<8 {
                    usleep(300_000)
                    for client in clients { try? client.send("X-Line-\(round): b\r\n") }
                }
                let statuses = clients.map { (try? $0.readResponse().status) ?? 0 }
                let closed = clients.allSatisfy { $0.waitForClose() }
                #expect(closed, "every trickling connection is closed")
                return (statuses, Double((NIODeadline.now() - start).nanoseconds) / 1e9)
            }
            #expect(statuses.allSatisfy { $0 == 408 }, "\(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
            #expect(elapsed < 10, "cut at request_head, not at the idle timeout")
            #expect(h.upstream.stats.withLockedValue { $0.requests } == 0, "nothing trickled reaches the app")
        }
    }

    @Test("a head that arrives within request_head is served, however long the connection was idle before")
    func headInTime() async throws {
        try await ProxyHarness.with(timeouts: Self.headInOneSecond) { h in
            let port = h.port
            let statuses = try await blocking { () -> [Int] in
                let client = try RawClient(port: port)
                try client.send("GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
                let first = try client.readResponse().status
                // Idle between requests (longer than request_head): the head's clock starts with its first byte.
                usleep(1_500_000)
                try client.send("GET /b HTTP/1.1\r\n")
                usleep(300_000)
                try client.send("Host: a\r\n\r\n")
                return [first, try client.readResponse().status]
            }
            #expect(statuses == [200, 200])
        }
    }

    @Test("over max_connections_per_client a connection is answered 503 with Retry-After at once; another client is served; a closed one frees its place")
    func perClientCap() async throws {
        var limits = ProxyLimits()
        limits.maxConnectionsPerClient = 5
        try await ProxyHarness.with(limits: limits) { h in
            let port = h.port
            try await blocking {
                let held = try (0..<5).map { _ in try RawClient(port: port) }
                for client in held {
                    try client.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                    #expect(try client.readResponse().status == 200)
                }
                let refused = try RawClient(port: port)
                let answer = try refused.readResponse()
                #expect(answer.status == 503)
                #expect(answer.header("retry-after") == "1")
                #expect(refused.waitForClose())
                let other = try RawClient(port: port, source: "127.0.0.2")
                try other.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                #expect(try other.readResponse().status == 200, "another address has places of its own")
                held[0].disconnect()
                // The gateway learns of the close asynchronously: the first connection after it
                // that is not refused shows the place came back (bounded).
                var served = false
                for _ in 0..<250 where !served {
                    let again = try RawClient(port: port)
                    try? again.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                    served = (try? again.readResponse().status) == 200
                    if !served { usleep(20_000) }
                }
                #expect(served)
            }
        }
    }

    @Test("over max_connections a connection from any address is answered 503 with Retry-After at once")
    func instanceCap() async throws {
        var limits = ProxyLimits()
        limits.maxConnections = 3
        let observer = Refusals()
        try await ProxyHarness.with(limits: limits, observer: observer) { h in
            let port = h.port
            try await blocking {
                let held = try ["127.0.0.1", "127.0.0.2", "127.0.0.3"].map { try RawClient(port: port, source: $0) }
                for client in held {
                    try client.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                    #expect(try client.readResponse().status == 200)
                }
                let refused = try RawClient(port: port, source: "127.0.0.4")
                let answer = try refused.readResponse()
                #expect(answer.status == 503 && answer.header("retry-after") == "1")
                #expect(answer.text.contains("too many open connections"))
                #expect(refused.waitForClose())
            }
            #expect(observer.counts.withLockedValue { $0.refused } == [.instance], "reported for sessiongate_connections_refused_total")
        }
    }

    @Test("a flood of 2,000 connections from one address and a slow route at max_in_flight are refused at once, while a normal client is served in under a second")
    func flood() async throws {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        limit.rlim_cur = limit.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        // The flood runs on event loops of its own: on the process's shared ones it held up
        // every other suite running beside it (their Apple calls timed out).
        try await withEventLoops(2) { loops in
            try await withTeardown(try await SilentUpstream.start(group: loops), stop: { try? await $0.close() }) { silent in
                let slowPort = silent.localAddress!.port!
                var limits = ProxyLimits()
                limits.maxConnectionsPerClient = 200
                let observer = Refusals()
                try await ProxyHarness.with(
                    timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .seconds(30)), limits: limits, group: loops,
                    observer: observer,
                    routes: { address in
                        [
                            ProxyRoute(name: "slow", pathPrefix: "/slow", upstream: UpstreamAddress(host: "127.0.0.1", port: slowPort), maxInFlight: 50),
                            ProxyRoute(name: "app", pathPrefix: "/", upstream: address),
                        ]
                    }
                ) { h in
                    let port = h.port
                    let flood = Int(min(2000, (limit.rlim_cur - 200) / 2))
                    let result = try await blocking { () -> (refused: Int, shed: Int, timedOut: Int, normal: Int, normalSeconds: Double) in
                        var clients: [RawClient] = []
                        for _ in 0..<flood { clients.append(try RawClient(port: port, timeoutSeconds: 5, source: "127.0.0.2")) }
                        for client in clients { try? client.send("GET /slow/x HTTP/1.1\r\nHost: a\r\n\r\n") }
                        // The gateway has refused or shed all of the flood but what went to the silent app:
                        // every other flood connection has its answer waiting (poll, no sleep).
                        var fds = clients.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
                        var answered = 0
                        while answered < flood - 50 {
                            guard poll(&fds, nfds_t(fds.count), 5000) > 0 else { break }
                            answered = fds.filter { $0.revents != 0 }.count
                        }
                        // The normal client, while the flood holds 200 connections and 50 requests at the app.
                        let start = NIODeadline.now()
                        let normal = try RawClient(port: port, timeoutSeconds: 5)
                        try normal.send("GET /page HTTP/1.1\r\nHost: a\r\n\r\n")
                        let status = try normal.readResponse().status
                        let seconds = Double((NIODeadline.now() - start).nanoseconds) / 1e9
                        var refused = 0, shed = 0, timedOut = 0
                        for client in clients {
                            guard let response = try? client.readResponse() else { continue }
                            if response.text.contains("too many open connections") { refused += 1 }
                            else if response.status == 503, response.header("retry-after") == "1" { shed += 1 }
                            else if response.status == 504 { timedOut += 1 }
                        }
                        return (refused, shed, timedOut, status, seconds)
                    }
                    #expect(result.normal == 200)
                    #expect(result.refused == flood - 200, "over the per-client cap: refused at accept")
                    #expect(result.shed == 150, "over max_in_flight: shed at once")
                    let reported = observer.counts.withLockedValue { $0 }
                    #expect(reported.shed == 150, "reported as upstream_errors kind max_in_flight")
                    #expect(reported.refused.count == flood - 200 && reported.refused.allSatisfy { $0 == .client })
                    #expect(result.timedOut == 50, "max_in_flight requests went to the silent app, and waited for it until upstream_response")
                    #expect(result.normalSeconds < 1, "served in \(result.normalSeconds) s while the flood held its places")
                }
            }
        }
    }
}
