import Foundation
import HTTPProxy
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TestSupport
import Testing

/// The pool against real sockets (issue 36): connections follow a principal's concurrency, an
/// upstream's budget bounds them with a bounded wait, the gateway's closes leave no
/// `TIME_WAIT` socket, and connect failures are logged (rate-limited) and counted.
@Suite("Upstream connections: churn, budgets, TIME_WAIT", .serialized)
struct UpstreamChurnTests {
    /// Counts what the pool reports: connects, and failures by route.
    final class Counts: ProxyObserver, Sendable {
        let connects = NIOLockedValueBox(0)
        let failures = NIOLockedValueBox<[String]>([])
        var wantsRequestDetails: Bool { false }
        func exchangeCompleted(_ record: ExchangeRecord) {}
        func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { failures.withLockedValue { $0.append("\(route) \(kind.rawValue)") } }
        func clientConnectionOpened() {}
        func clientConnectionClosed() {}
        func upstreamConnectionOpened(_ upstream: UpstreamAddress) { connects.withLockedValue { $0 += 1 } }
        func upstreamConnectionClosed() {}
    }

    /// Admits every request as one user.
    struct OneUser: RequestGuard {
        func admit(_ request: GuardRequest, on eventLoop: any EventLoop) -> GuardDecision {
            .verdict(.forward(addHeaders: [("X-Auth-User", "alice")], user: "alice"))
        }
    }

    @Test("one user on six client connections keeps six upstream connections: no connect per request once they are open", arguments: [6, 20])
    func oneUserManyConnections(clients: Int) async throws {
        let counts = Counts()
        try await ProxyHarness.with(guard: OneUser(), observer: counts) { h in
            let port = h.port
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<clients {
                    group.addTask {
                        try await blocking {
                            let client = try RawClient(port: port, timeoutSeconds: 10)
                            // Slow enough that every client's request is in flight at once.
                            for _ in 0..<8 {
                                try client.send("GET /slow?ms=30 HTTP/1.1\r\nHost: a\r\n\r\n")
                                guard try client.readResponse().status == 200 else { throw RawClient.Failure.closed }
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let connects = counts.connects.withLockedValue { $0 }
            #expect(connects <= clients, "\(connects) connects for \(clients * 8) requests of one user on \(clients) connections")
        }
    }

    @Test("the gateway's closes of upstream connections leave no TIME_WAIT socket on either side")
    func noTimeWait() async throws {
        try await ProxyHarness.with(routes: { address in [ProxyRoute(name: "app", upstream: address, upstreamReuse: .none)] }) { h in
            let port = h.port
            let upstreamPort = h.upstream.port
            try await blocking {
                let client = try RawClient(port: port, timeoutSeconds: 5)
                for _ in 0..<40 {
                    try client.send("GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
                    guard try client.readResponse().status == 200 else { throw RawClient.Failure.closed }
                }
            }
            try await eventually("every upstream connection has ended (only the listener and TIME_WAIT remain)", within: .seconds(5)) {
                TCPTable.sockets(port: upstreamPort).allSatisfy { $0 == .listen || $0 == .timeWait }
            }
            let waiting = TCPTable.sockets(port: upstreamPort).filter { $0 == .timeWait }.count
            #expect(waiting == 0, "\(waiting) TIME_WAIT sockets after 40 connections closed")
        }
    }

    /// A proxy (one event loop) whose route may hold one connection to its app, taken by a
    /// request of `holdMilliseconds`, or (nil) one the app answers only once the second has its
    /// answer; then another client asks for `GET /echo`. What each got.
    static func secondRequestWhileHeld(holdMilliseconds: Int?, connectTimeout: TimeAmount, observer: Counts = Counts()) async throws
        -> (holder: Int, second: RawClient.Response)
    {
        try await withEventLoops(1) { loops in
            let timeouts = ProxyConfiguration.Timeouts(upstreamConnect: connectTimeout, upstreamResponse: .seconds(5), idle: .seconds(10))
            return try await ProxyHarness.with(timeouts: timeouts, group: loops, observer: observer, routes: { address in
                [ProxyRoute(name: "app", upstream: address, upstreamReuse: .shared, upstreamMaxConnections: 1)]
            }) { h in
                let port = h.port
                let holder = try RawClient(port: port, timeoutSeconds: 5)
                let holding = holdMilliseconds.map { "/slow?ms=\($0)" } ?? "/hold"
                await h.upstream.waitForArrival(of: holdMilliseconds == nil ? "/hold" : "/slow") {
                    try? holder.send("GET \(holding) HTTP/1.1\r\nHost: a\r\n\r\n")
                }
                async let held = blocking { try holder.readResponse().status }
                let second = try await blocking { () -> RawClient.Response in
                    let client = try RawClient(port: port, timeoutSeconds: 5)
                    try client.send("GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
                    return try client.readResponse()
                }
                h.upstream.releaseHeld()
                return (try await held, second)
            }
        }
    }

    @Test("over its upstream_max_connections a request waits for a connection to come free, and gets it")
    func waitsForAFreeConnection() async throws {
        let (holder, second) = try await Self.secondRequestWhileHeld(holdMilliseconds: 300, connectTimeout: .seconds(10))
        #expect(holder == 200)
        #expect(second.status == 200)
    }

    @Test("a request that finds every connection of the budget in use for upstream_connect is answered 503 with Retry-After, and counted")
    func busyIs503() async throws {
        let counts = Counts()
        let (holder, refused) = try await Self.secondRequestWhileHeld(holdMilliseconds: nil, connectTimeout: .milliseconds(300), observer: counts)
        #expect(refused.status == 503)
        #expect(refused.header("retry-after") == "1")
        #expect(refused.text.contains("upstream_max_connections"))
        #expect(holder == 200, "the request holding the connection is unaffected")
        #expect(counts.failures.withLockedValue { $0 } == ["app connections_exhausted"])
    }

    @Test("an open WebSocket tunnel leaves the budget: with upstream_max_connections 1, a request still gets a connection beside it")
    func tunnelsLeaveTheBudget() async throws {
        try await withEventLoops(1) { loops in
            let timeouts = ProxyConfiguration.Timeouts(upstreamConnect: .milliseconds(500), upstreamResponse: .seconds(5), idle: .seconds(10))
            try await ProxyHarness.with(timeouts: timeouts, group: loops, routes: { address in
                [ProxyRoute(name: "app", upstream: address, upstreamMaxConnections: 1)]
            }) { h in
                let port = h.port
                let (upgraded, echoed, second) = try await blocking { () -> (Int, String, Int) in
                    let tunnel = try RawClient(port: port, timeoutSeconds: 5)
                    try tunnel.send("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
                    let upgraded = try tunnel.readResponse().status
                    try tunnel.send("ping")
                    let echoed = String(decoding: try tunnel.read(count: 4), as: UTF8.self)
                    let client = try RawClient(port: port, timeoutSeconds: 5)
                    try client.send("GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
                    return (upgraded, echoed, try client.readResponse().status)
                }
                #expect(upgraded == 101 && echoed == "ping", "the tunnel is open")
                #expect(second == 200, "not 503: the tunnel holds no place in the budget")
            }
        }
    }

    @Test("connect failures are logged once a second per upstream, naming it and the errno, and each is counted on its route")
    func connectFailuresLogged() async throws {
        let counts = Counts()
        let recorder = LogRecorder()
        let closedPort = try closedPort()
        try await ProxyHarness.with(upstreamPort: closedPort, observer: counts, logger: Logger(label: "test") { _ in recorder }) { h in
            let port = h.port
            let statuses = try await blocking { () -> [Int] in
                let client = try RawClient(port: port, timeoutSeconds: 5)
                return try (0..<10).map { _ in
                    try client.send("GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
                    return try client.readResponse().status
                }
            }
            #expect(statuses == Array(repeating: 502, count: 10))
            #expect(counts.failures.withLockedValue { $0 } == Array(repeating: "test connect_refused", count: 10))
            let lines = recorder.all.filter { $0.contains("upstream connect failed") }
            #expect(lines.count >= 1 && lines.count <= 2, "rate-limited: \(lines)")
            #expect(lines.first?.contains("upstream=127.0.0.1:\(closedPort)") == true)
            #expect(lines.first?.contains("errno 111") == true, "ECONNREFUSED named: \(lines)")
        }
    }
}

/// The kernel's TCP table (`/proc/net/tcp`): the states of the IPv4 sockets on a port.
enum TCPTable {
    enum State: String {
        case established = "01", timeWait = "06", listen = "0A", other
    }

    static func sockets(port: Int) -> [State] {
        guard let text = try? String(contentsOfFile: "/proc/net/tcp", encoding: .utf8) else { return [] }
        let hex = String(format: "%04X", port)
        return text.split(separator: "\n").dropFirst().compactMap { line in
            let columns = line.split(separator: " ")
            guard columns.count > 3 else { return nil }
            let local = columns[1].split(separator: ":").last, remote = columns[2].split(separator: ":").last
            guard local == Substring(hex) || remote == Substring(hex) else { return nil }
            return State(rawValue: String(columns[3])) ?? .other
        }
    }
}

