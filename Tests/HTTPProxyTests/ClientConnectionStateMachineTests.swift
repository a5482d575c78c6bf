import GatewayConfig
import NIOCore
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// The HTTP/1 connection machine alone, without a channel: its own states (between requests, a
/// request in flight, closing, lingering, a tunnel, gone) against every event that reaches it.
/// What happens inside an exchange is `ExchangeStateMachineTests`'.
@Suite("ClientConnectionStateMachine: (state, event) → (action, state)")
struct ClientConnectionStateMachineTests {
    typealias Machine = ClientConnectionStateMachine
    static let timeouts = ProxyConfiguration.Timeouts(upstreamConnect: .seconds(1), upstreamResponse: .seconds(5), idle: .seconds(60),
                                                      requestBody: .seconds(10), requestHead: .seconds(30))
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

    /// Feeds a body-less GET; returns the number of the exchange the machine asks the guard about.
    func admitted(_ m: inout Machine, _ path: String = "/") throws -> UInt64 {
        guard case .admit(let id, _) = m.requestPart(.head(try head("GET \(path) HTTP/1.1\r\nHost: a\r\n\r\n")), now: Self.t0) else {
            Issue.record("no admission asked")
            throw CancellationError()
        }
        var accepts = m.acceptsParts
        #expect(accepts, "the request's end is still to come")
        #expect(m.requestPart(.end(nil), now: Self.t0) == .none)
        accepts = m.acceptsParts
        #expect(!accepts, "a pipelined request waits unparsed for its turn")
        return id
    }

    enum Stage: String, CaseIterable, Sendable {
        case idle = "between requests"
        case headPending = "a head arriving"
        case inFlight = "a request in flight"
        case inFlightClose = "a request in flight that asked to close"
        case midBody = "a request body arriving"
        case closing = "closing"
        case lingering = "lingering"
        case tunnel = "a tunnel"
        case closed = "gone"
    }

    enum Event: String, Sendable {
        case head = "a request head"
        case body = "body bytes"
        case unreadable = "bytes that are not HTTP"
        case fin = "the client's FIN"
        case finPipelined = "the client's FIN behind pipelined bytes"
        case quiesce = "the server draining"
        case clientClosed = "the connection closing"
        case refuse = "its verdict 403"
        case staleVerdict = "a verdict for an earlier exchange"
        case headDeadline = "the head deadline"
        case idle = "the idle timeout"
    }

    /// A machine taken to a stage by real events; the exchange in flight, if any.
    func reach(_ stage: Stage) throws -> (Machine, UInt64?) {
        var m = machine()
        switch stage {
        case .idle: return (m, nil)
        case .headPending:
            m.headPending(true, now: Self.t0)
            return (m, nil)
        case .inFlight:
            let id = try admitted(&m)
            return (m, id)
        case .inFlightClose:
            guard case .admit(let id, _) = m.requestPart(.head(try head("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")), now: Self.t0) else {
                throw CancellationError()
            }
            _ = m.requestPart(.end(nil), now: Self.t0)
            return (m, id)
        case .midBody:
            guard case .admit(let id, _) = m.requestPart(.head(try head("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")), now: Self.t0) else {
                throw CancellationError()
            }
            _ = m.requestPart(.body(ByteBuffer(string: "01234")), now: Self.t0)
            return (m, id)
        case .closing:
            _ = m.quiesce()
            return (m, nil)
        case .lingering:
            _ = m.quiesce()
            m.lingering()
            return (m, nil)
        case .tunnel:
            m.state = .tunnel
            return (m, nil)
        case .closed:
            _ = m.clientClosed()
            return (m, nil)
        }
    }

    func run(_ event: Event, on m: inout Machine, exchange: UInt64?) throws -> Machine.Action {
        switch event {
        case .head: return m.requestPart(.head(try head("GET /n HTTP/1.1\r\nHost: a\r\n\r\n")), now: Self.t0)
        case .body: return m.requestPart(.body(ByteBuffer(string: "56789")), now: Self.t0)
        case .unreadable: return m.requestUnreadable(.malformed("junk"), now: Self.t0)
        case .fin: return m.clientInputClosed(unparsedBytes: false)
        case .finPipelined: return m.clientInputClosed(unparsedBytes: true)
        case .quiesce: return m.quiesce()
        case .clientClosed: return m.clientClosed()
        case .refuse: return m.verdict(.success(.respond(.error(.forbidden, "no"))), for: exchange ?? 0, now: Self.t0)
        case .staleVerdict: return m.verdict(.success(.forward), for: 99, now: Self.t0)
        case .headDeadline: return m.timerFired(now: Self.t0 + .seconds(30))
        case .idle: return m.timerFired(now: Self.t0 + Self.timeouts.idle)
        }
    }

    /// The action as the table writes it: responses by their status line and what follows.
    static func summary(_ action: Machine.Action) -> String {
        switch action {
        case .none: return "none"
        case .admit: return "admit"
        case .respond(var bytes, let ended, _, _, let after):
            let line = bytes.readString(length: 12) ?? ""
            return "\(line.dropFirst(9)) \(after == .close ? "close" : "next") (logged \(ended.log.status))"
        case .abort(let ended, _, _): return "abort (logged \(ended?.log.status ?? 0))"
        case .close: return "close"
        case .discard: return "discard"
        case .drop: return "drop"
        default: return "\(action)"
        }
    }

    static func name(_ state: Machine.State) -> String {
        switch state {
        case .idle(nil): return "idle"
        case .idle(.some): return "idle(head)"
        case .exchange(_, let keepAlive): return keepAlive ? "exchange" : "exchange(close)"
        case .closing: return "closing"
        case .lingering: return "lingering"
        case .tunnel: return "tunnel"
        case .closed: return "closed"
        case .modifying: return "modifying"
        }
    }

    typealias Row = TransitionRow<Stage, Event>

    static let rows: [Row] = [
        Row(.idle, .head, "admit", "exchange"),
        Row(.idle, .body, "none", "idle"),
        Row(.idle, .unreadable, "400 close (logged 400)", "closing"),
        Row(.idle, .fin, "close", "closing"),
        Row(.idle, .quiesce, "close", "closing"),
        Row(.idle, .clientClosed, "none", "closed"),
        Row(.idle, .staleVerdict, "discard", "idle"),
        Row(.idle, .headDeadline, "none", "idle"),
        Row(.idle, .idle, "close", "closing"),
        Row(.headPending, .headDeadline, "408 close (logged 408)", "closing"),
        Row(.headPending, .head, "admit", "exchange"),
        Row(.inFlight, .refuse, "403 next (logged 403)", "idle"),
        Row(.inFlight, .staleVerdict, "discard", "exchange"),
        Row(.inFlight, .head, "none", "exchange"),
        Row(.inFlight, .fin, "none", "exchange(close)"),
        Row(.inFlight, .finPipelined, "none", "exchange"),
        Row(.inFlight, .quiesce, "none", "exchange"),
        Row(.inFlight, .unreadable, "400 close (logged 400)", "closing"),
        Row(.inFlight, .clientClosed, "drop", "closed"),
        Row(.inFlight, .idle, "503 close (logged 503)", "closing"),
        Row(.inFlightClose, .refuse, "403 close (logged 403)", "closing"),
        Row(.midBody, .refuse, "403 close (logged 403)", "closing"),
        Row(.midBody, .body, "none", "exchange"),
        Row(.midBody, .fin, "abort (logged 499)", "closing"),
        Row(.midBody, .unreadable, "400 close (logged 400)", "closing"),
        Row(.closing, .head, "none", "closing"),
        Row(.closing, .staleVerdict, "discard", "closing"),
        Row(.closing, .idle, "none", "closing"),
        Row(.closing, .fin, "none", "closing"),
        Row(.lingering, .body, "none", "lingering"),
        Row(.lingering, .idle, "none", "lingering"),
        Row(.lingering, .clientClosed, "none", "closed"),
        Row(.tunnel, .head, "none", "tunnel"),
        Row(.tunnel, .idle, "none", "tunnel"),
        Row(.closed, .head, "none", "closed"),
        Row(.closed, .staleVerdict, "discard", "closed"),
        Row(.closed, .idle, "none", "closed"),
    ]

    @Test("each state and event gives one action and one next state", arguments: rows)
    func transition(_ row: Row) throws {
        var (m, exchange) = try reach(row.stage)
        let action = try run(row.event, on: &m, exchange: exchange)
        #expect(Self.summary(action) == row.action)
        #expect(Self.name(m.state) == row.after)
    }

    @Test("every stage of the table is reached by real events, and every stage is in the table")
    func coverage() throws {
        for stage in Stage.allCases {
            _ = try reach(stage)
            #expect(Self.rows.contains { $0.stage == stage }, "\(stage.rawValue)")
        }
    }

    @Test("answers for an exchange the machine no longer waits for find no state: a verdict is discarded, a connection closed")
    func lateAnswers() throws {
        var m = machine()
        let first = try admitted(&m)
        guard case .respond(_, _, _, _, .nextRequest) = m.verdict(.success(.respond(.error(.forbidden, "no"))), for: first, now: Self.t0) else {
            Issue.record("a 403 keeps the connection")
            return
        }
        // The same verdict again (a duplicate callback), and answers for it that come late:
        #expect(m.verdict(.success(.forward), for: first, now: Self.t0) == .discard(.forward))
        let second = try admitted(&m, "/2")
        #expect(m.verdict(.success(.forward), for: first, now: Self.t0) == .discard(.forward))
        let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
        #expect(m.connected(.success(connection), for: first, now: Self.t0) == .closeUpstream(connection))
        #expect(m.answered(.success(.error(.ok, "x")), for: first) == .none)
        // The current exchange still gets its own.
        guard case .connect(second, _, .client(7), pooled: true) = m.verdict(.success(.forward), for: second, now: Self.t0) else {
            Issue.record("no connect")
            return
        }
    }

    @Test("a response relayed to an HTTP/1.0 client without a length ends with the connection")
    func untilClose() throws {
        var m = machine()
        guard case .admit(let id, _) = m.requestPart(.head(try head("GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")), now: Self.t0) else {
            throw CancellationError()
        }
        _ = m.requestPart(.end(nil), now: Self.t0)
        #expect(Self.name(m.state) == "exchange")
        _ = m.verdict(.success(.forward), for: id, now: Self.t0)
        let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
        _ = m.connected(.success(connection), for: id, now: Self.t0)
        var parser = HeadParser(kind: .response, maxHeadBytes: 4096, maxFields: 50)
        var bytes = ByteBuffer(string: "HTTP/1.1 200 OK\r\n\r\n")
        let response = try #require(try parser.parse(&bytes))
        guard case .write(var written) = m.upstreamPart(.head(response), now: Self.t0) else { Issue.record("no head written"); return }
        #expect(written.readString(length: written.readableBytes)?.contains("connection: close\r\n") == true)
        #expect(Self.name(m.state) == "exchange(close)")
        guard case .finish(_, lastChunk: false, let upstream, reuse: true, after: .close) = m.upstreamPart(.end(nil), now: Self.t0), upstream === connection else {
            Issue.record("not finished with a close")
            return
        }
        #expect(Self.name(m.state) == "closing")
    }

    @Test("an action stays a few words (a head in one made every event a large copy: 2 µs a request)")
    func actionSize() {
        #expect(MemoryLayout<Machine.Action>.size <= 64, "\(MemoryLayout<Machine.Action>.size) bytes")
        #expect(MemoryLayout<ExchangeStateMachine.Action>.size <= 64, "\(MemoryLayout<ExchangeStateMachine.Action>.size) bytes")
    }
}
