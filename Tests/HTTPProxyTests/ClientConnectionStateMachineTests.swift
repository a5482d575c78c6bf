import GatewayConfig
import NIOCore
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// The state machine alone, without a channel: events in, actions out.
@Suite("ClientConnectionStateMachine without I/O")
struct ClientConnectionStateMachineTests {
    typealias Machine = ClientConnectionStateMachine
    static let timeouts = ProxyConfiguration.Timeouts(upstreamConnect: .seconds(1), upstreamResponse: .seconds(5), idle: .seconds(30),
                                                      requestBody: .seconds(10))
    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

    func machine() -> Machine {
        let routes = [ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1))]
        let snapshot = RoutingSnapshot(routes: routes, identityHeaders: [], trustedProxies: [])
        let configuration = ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0), timeouts: Self.timeouts)
        var m = Machine(shared: ProxyShared(snapshot: snapshot, configuration: configuration, observer: SilentProxyObserver()), seed: 7)
        m.connectionStarted(remoteAddress: try? SocketAddress(ipAddress: "192.0.2.1", port: 9), clientID: 7, now: Self.t0)
        return m
    }

    func head(_ text: String) throws -> WireHead {
        var parser = HeadParser(kind: .request, maxHeadBytes: 4096, maxFields: 50)
        var bytes = ByteBuffer(string: text)
        return try #require(try parser.parse(&bytes))
    }

    /// Feeds a body-less GET; returns the exchange the machine asks the guard about.
    func admitted(_ m: inout Machine, _ path: String = "/") throws -> ExchangeContext {
        guard case .admit(let x, _) = m.requestPart(.head(try head("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n")), now: Self.t0) else {
            Issue.record("no admission asked")
            throw CancellationError()
        }
        var accepts = m.acceptsParts
        #expect(accepts, "the request's end is still to come")
        guard case .none = m.requestPart(.end(nil), now: Self.t0) else { throw CancellationError() }
        accepts = m.acceptsParts
        #expect(!accepts, "a pipelined request waits unparsed for its turn")
        return x
    }

    @Test("answers for an exchange the machine no longer waits for find no state: a verdict is discarded, a connection closed")
    func lateAnswers() throws {
        var m = machine()
        let first = try admitted(&m)
        guard case .respond(_, _, _, _, .nextRequest) = m.verdict(.success(.respond(.error(.forbidden, "no"))), for: first, now: Self.t0) else {
            Issue.record("a 403 keeps the connection")
            return
        }
        let between = m.acceptsParts
        #expect(between, "between requests")
        // The same verdict again (a duplicate callback), and answers for it that come late:
        guard case .discard = m.verdict(.success(.forward), for: first, now: Self.t0) else { Issue.record("late verdict applied"); return }
        let second = try admitted(&m, "/2")
        guard case .discard = m.verdict(.success(.forward), for: first, now: Self.t0) else { Issue.record("another exchange's verdict applied"); return }
        let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
        guard case .closeUpstream = m.connected(.success(connection), for: first, now: Self.t0) else { Issue.record("a stale connection used"); return }
        guard case .none = m.answered(.success(.error(.ok, "x")), for: first) else { Issue.record("a stale answer applied"); return }
        // The current exchange still gets its own.
        guard case .connect(let x, _, _, pooled: true) = m.verdict(.success(.forward), for: second, now: Self.t0) else { Issue.record("no connect"); return }
        #expect(x === second)
    }

    @Test("the retry-once rule: a reused connection closed before any response byte is retried on a fresh one, once")
    func retryOnce() throws {
        var m = machine()
        let x = try admitted(&m)
        guard case .connect = m.verdict(.success(.forward), for: x, now: Self.t0) else { Issue.record("no connect"); return }
        let reused = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
        reused.reused = true
        guard case .startForwarding(_, _, let body) = m.connected(.success(reused), for: x, now: Self.t0) else { Issue.record("not forwarded"); return }
        #expect(body.count == 1, "the request's end, buffered while connecting")
        guard case .connect(_, _, _, pooled: false) = m.upstreamClosed(nil) else { Issue.record("not retried"); return }
        guard case .startForwarding = m.connected(.success(UpstreamConnection(address: reused.address)), for: x, now: Self.t0) else {
            Issue.record("retry not forwarded"); return
        }
        guard case .respond(_, _, _, .closedBeforeResponse, _) = m.upstreamClosed(nil) else { Issue.record("retried twice"); return }
    }

    @Test("the idle timeout, by state", arguments: [
        ("between requests", 0, "close"),
        ("waiting for the verdict", 1, "503"),
        ("waiting for a connection", 2, "504"),
    ])
    func idleTimeout(_ name: String, stage: Int, expected: String) throws {
        var m = machine()
        if stage >= 1 {
            let x = try admitted(&m)
            if stage >= 2 { _ = m.verdict(.success(.forward), for: x, now: Self.t0) }
        }
        guard case .none = m.timerFired(now: Self.t0 + Self.timeouts.idle - .milliseconds(1)) else { Issue.record("\(name): too early"); return }
        let action = m.timerFired(now: Self.t0 + Self.timeouts.idle)
        switch (action, expected) {
        case (.close, "close"): break
        case (.respond(var bytes, _, _, _, .close), _):
            #expect(bytes.readString(length: 12) == "HTTP/1.1 \(expected)", "\(name)")
        default: Issue.record("\(name): \(action)")
        }
        let closed = m.isClosed
        #expect(closed, "\(name)")
    }
}
