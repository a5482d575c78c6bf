import AllocationCounter
import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import HTTPProxy
import TestSupport

/// Heap allocations per HTTP/2 stream in steady state, counted on the proxy's one event loop
/// (the app runs on other threads, the client is another process): a client connection sends
/// one GET after another, each on a new stream, through h2c to a kept upstream connection.
/// Two connections of different lengths are counted whole and their difference divided by the
/// extra streams, so that what a connection costs once (the preface, SETTINGS, its close)
/// cancels out. The rule is `AllocationTests`': above the threshold fails, well below it too.
@Suite("Allocations per HTTP/2 stream (counted on the proxy's loop, release build)", .serialized, .timeLimit(.minutes(2)))
struct HTTP2AllocationTests {
    /// The committed count, release build: measured 51.0 (HTTP/1.1's public route: 14; issue 41
    /// is to bring it there). The debug build counted 146.
    static let threshold = 51

    /// Says when each client connection has closed.
    struct Closes: ProxyObserver {
        let events: AsyncStream<Void>
        let continuation: AsyncStream<Void>.Continuation
        init() { (events, continuation) = AsyncStream<Void>.makeStream() }
        var wantsRequestDetails: Bool { false }
        func exchangeCompleted(_ record: ExchangeRecord) {}
        func upstreamFailed(_ kind: UpstreamErrorKind, route: String) {}
        func clientConnectionOpened() {}
        func clientConnectionClosed() { continuation.yield() }
        func upstreamConnectionOpened(_ upstream: UpstreamAddress) {}
        func upstreamConnectionClosed() {}
    }

    @Test("heap allocations per HTTP/2 stream stay at the committed count")
    func perStream() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let upstream = try await HTTP2ExchangeTests.RecordingUpstream.start()
        let routes = [ProxyRoute(name: "app", upstream: UpstreamAddress(host: "127.0.0.1", port: upstream.port))]
        let snapshot = RoutingSnapshot(routes: routes, identityHeaders: ["X-Auth-User"], trustedProxies: [])
        var configuration = ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0),
                                               timeouts: .init(upstreamConnect: .seconds(2), upstreamResponse: .seconds(5), idle: .seconds(30)))
        configuration.http2.cleartext = true
        let closes = Closes()
        var closed = closes.events.makeAsyncIterator()
        let proxy = ProxyServer(configuration: configuration, routing: snapshot, group: group, observer: closes, logger: Logger(label: "test"))
        try await proxy.start()
        let port = proxy.localAddress!.port!

        /// Allocations on the proxy's loop for one connection of `streams` streams, one after another.
        func connection(_ streams: Int) async throws -> Int {
            let lines = (0..<streams).flatMap { i -> [String] in
                let stream = 1 + 2 * i
                return [HTTP2ServerTests.headers(stream, HTTP2ServerTests.get), HTTP2ServerTests.line(["wait_for": "DATA stream=\(stream)"])]
            }
            try await loop.submit { sg_allocations_start() }.get()
            let answer = try await HTTP2ServerTests.frames(port, lines, timeout: 10, settle: 0.1)
            // The script's end closes the connection: its close is counted too.
            _ = await closed.next()
            let count = try await loop.submit { sg_allocations_stop() }.get()
            #expect(answer.filter { $0.hasPrefix("HEADERS") && $0.contains(":status=200") }.count == streams, "\(answer.suffix(3))")
            return count
        }
        _ = try await connection(20)  // warm: the upstream connection is made, then kept
        let few = try await connection(50)
        let many = try await connection(250)
        let perStream = Double(many - few) / 200
        print("allocations per HTTP/2 stream: \(perStream)")
        // The longer connection lives longer: its timers (re-armed per second, not per stream)
        // add a few allocations to the 200 streams' difference (51.01 measured), never half one.
        let problem = allocationProblem(perStream, committed: Self.threshold, slack: 0.5, per: "stream")
        #expect(problem == nil, "\(problem ?? "")")
        await proxy.shutdown(deadline: .seconds(1))
        await upstream.close()
        try await group.shutdownGracefully()
    }
}
