import GatewayConfig
import NIOCore
import NIOHPACK
import NIOHTTP2
import Testing

@testable import HTTPProxy

/// The HTTP/2 stream machine alone, without a channel: its own states (the header block awaited,
/// an exchange, done) against every event that reaches a stream. What happens inside the
/// exchange is `ExchangeStateMachineTests`'; the frames on a real connection are
/// `HTTP2ServerTests`' and `HTTP2ExchangeTests`'.
@Suite("HTTP2StreamStateMachine: (state, event) → (action, state)")
struct HTTP2StreamStateMachineTests {
    typealias Machine = HTTP2StreamStateMachine
    static let timeouts = ProxyConfiguration.Timeouts(upstreamConnect: .seconds(1), upstreamResponse: .seconds(5), idle: .seconds(60),
                                                      requestBody: .seconds(10), requestHead: .seconds(30))
    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)
    static let shared: ProxyShared = {
        let routes = [ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1))]
        let snapshot = RoutingSnapshot(routes: routes, identityHeaders: [], trustedProxies: [])
        let configuration = ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0), timeouts: timeouts)
        return ProxyShared(snapshot: snapshot, configuration: configuration, observer: SilentProxyObserver())
    }()

    static func headers(_ method: String = "GET", _ extra: [(String, String)] = []) -> HPACKHeaders {
        HPACKHeaders([(":method", method), (":scheme", "https"), (":authority", "app"), (":path", "/x")] + extra)
    }

    static func start(_ m: inout Machine, _ headers: HPACKHeaders, endStream: Bool) -> Machine.Action {
        var ids: UInt64 = 0
        return m.start(headers, endStream: endStream, now: t0, shared: shared, maxHeaderListSize: 0, client: nil, requestID: "id") {
            ids += 1
            return ids
        }
    }

    enum Stage: String, CaseIterable, Sendable {
        case head = "the header block awaited"
        case verdict = "a GET awaiting its verdict"
        case body = "a POST awaiting its verdict, its body arriving"
        case forwarding = "a GET forwarded, its response awaited"
        case done = "done"
    }

    enum Event: String, Sendable {
        case request = "a valid header block"
        case malformed = "a header block with an upper-case name"
        case tooLarge = "a header block over the head limit"
        case data = "body bytes"
        case end = "the body's end"
        case early = "the timer, nothing due yet"
        case headDeadline = "the head deadline"
        case responseDeadline = "the response deadline"
        case idle = "the idle timeout"
    }

    /// A machine taken to a stage by real events.
    static func reach(_ stage: Stage) throws -> Machine {
        var m = Machine(now: t0)
        switch stage {
        case .head: break
        case .verdict:
            try #require(summary(start(&m, headers(), endStream: true)) == "ask guard")
        case .body:
            try #require(summary(start(&m, headers("POST", [("content-length", "10")]), endStream: false)) == "ask guard")
            _ = m.requestPart(.body(ByteBuffer(string: "01234")), now: t0, responseTimeout: timeouts.upstreamResponse)
        case .forwarding:
            try #require(summary(start(&m, headers(), endStream: true)) == "ask guard")
            let client = ExchangeStateMachine.Client(id: 1, address: "192.0.2.1", trusted: false, scheme: "https")
            _ = m.withExchange { $0.verdict(.success(.forward), client: client, allocator: ByteBufferAllocator(), now: t0) }
            let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
            let started = m.withExchange { $0.connected(.success(connection), now: t0, responseTimeout: timeouts.upstreamResponse) }
            guard case .startForwarding = started else { throw CancellationError() }
        case .done:
            try #require(summary(start(&m, headers("GET", [("X-Upper", "1")]), endStream: true)) == "reset PROTOCOL_ERROR")
        }
        return m
    }

    static func run(_ event: Event, on m: inout Machine) -> Machine.Action {
        switch event {
        case .request: return start(&m, headers(), endStream: true)
        case .malformed: return start(&m, headers("GET", [("X-Upper", "1")]), endStream: true)
        case .tooLarge: return start(&m, headers("GET", [("x-big", String(repeating: "a", count: 20_000))]), endStream: true)
        case .data: return m.requestPart(.body(ByteBuffer(string: "56789")), now: t0, responseTimeout: timeouts.upstreamResponse)
        case .end: return m.requestPart(.end(nil), now: t0, responseTimeout: timeouts.upstreamResponse)
        case .early: return m.timerFired(now: t0 + .seconds(1), timeouts)
        case .headDeadline: return m.timerFired(now: t0 + timeouts.requestHead, timeouts)
        case .responseDeadline: return m.timerFired(now: t0 + timeouts.upstreamResponse, timeouts)
        case .idle: return m.timerFired(now: t0 + timeouts.idle, timeouts)
        }
    }

    /// The action as the table writes it: a local response by its status.
    static func summary(_ action: Machine.Action) -> String {
        switch action {
        case .none: return "none"
        case .askGuard: return "ask guard"
        case .reset(.protocolError): return "reset PROTOCOL_ERROR"
        case .reset(.cancel): return "reset CANCEL"
        case .reset(let code): return "reset \(code)"
        case .exchange(.respond(let response, _, _)): return "respond \(response.status.code)"
        case .exchange(.none): return "exchange none"
        case .exchange(let other): return "exchange \(other)".prefix(40).description
        }
    }

    static func name(_ state: Machine.State) -> String {
        switch state {
        case .head: return "head"
        case .exchange(let x): return "exchange(\(x.phase))"
        case .done: return "done"
        }
    }

    typealias Row = TransitionRow<Stage, Event>

    static let rows: [Row] = [
        Row(.head, .request, "ask guard", "exchange(awaitingVerdict)"),
        Row(.head, .malformed, "reset PROTOCOL_ERROR", "done"),
        Row(.head, .tooLarge, "respond 431", "exchange(closed)"),
        Row(.head, .data, "none", "head"),
        Row(.head, .early, "none", "head"),
        Row(.head, .headDeadline, "reset CANCEL", "done"),
        Row(.verdict, .request, "none", "exchange(awaitingVerdict)"),
        Row(.verdict, .early, "none", "exchange(awaitingVerdict)"),
        Row(.verdict, .idle, "respond 503", "exchange(closed)"),
        Row(.body, .data, "exchange none", "exchange(awaitingVerdict)"),
        Row(.body, .idle, "respond 408", "exchange(closed)"),
        Row(.forwarding, .early, "none", "exchange(forwarding)"),
        Row(.forwarding, .responseDeadline, "respond 504", "exchange(closed)"),
        Row(.done, .request, "none", "done"),
        Row(.done, .data, "none", "done"),
        Row(.done, .idle, "none", "done"),
    ]

    @Test("each state and event gives one action and one next state", arguments: rows)
    func transition(_ row: Row) throws {
        var m = try Self.reach(row.stage)
        let action = Self.run(row.event, on: &m)
        #expect(Self.summary(action) == row.action)
        #expect(Self.name(m.state) == row.after)
    }

    @Test("every stage of the table is reached by real events, and every stage is in the table")
    func coverage() throws {
        for stage in Stage.allCases {
            _ = try Self.reach(stage)
            #expect(Self.rows.contains { $0.stage == stage }, "\(stage.rawValue)")
        }
    }

    @Test("the stream's close: a forwarded exchange is recorded as the client's abort, one awaiting its verdict only gives its places back, and the upstream is handed back to close")
    func streamClosed() throws {
        for (stage, expected) in [(Stage.head, "nothing"), (.verdict, "release"), (.body, "release"), (.forwarding, "record 499"), (.done, "nothing")] {
            var m = try Self.reach(stage)
            let (ending, upstream) = m.streamClosed()
            let said: String
            switch ending {
            case .nothing: said = "nothing"
            case .release: said = "release"
            case .record(let x): said = "record \(x.log.record(aborted: true, client: "-", now: Self.t0).status)"
            }
            #expect(said == expected, "\(stage.rawValue)")
            #expect((upstream != nil) == (stage == .forwarding), "\(stage.rawValue)")
            #expect(Self.name(m.state) == "done")
        }
    }

    @Test("the exchange's end takes it out of the stream, which is done: a second end finds none")
    func end() throws {
        var m = try Self.reach(.verdict)
        let ended = m.end()
        #expect(ended?.log.requestID == "id")
        #expect(Self.name(m.state) == "done")
        #expect(m.end() == nil)
    }

    @Test("the deadline: the head's while the block is awaited, the body's allowance while a body arrives, the response's once forwarded, else the idle timeout")
    func deadlines() throws {
        let t = Self.timeouts
        var (head, verdict, body, forwarding) = (try Self.reach(.head), try Self.reach(.verdict), try Self.reach(.body), try Self.reach(.forwarding))
        let deadlines = (head.deadline(t), verdict.deadline(t), body.deadline(t), forwarding.deadline(t))
        #expect(deadlines.0 == Self.t0 + t.requestHead)
        #expect(deadlines.1 == Self.t0 + t.idle)
        #expect(deadlines.2 == Self.t0 + t.requestBody)
        #expect(deadlines.3 == Self.t0 + t.upstreamResponse)
    }

    @Test("the stream is read while the header block is awaited and the exchange can take what it sends; never once done")
    func reading() throws {
        var (head, done) = (try Self.reach(.head), try Self.reach(.done))
        let (reads, readsDone) = (head.wantsRead(), done.wantsRead())
        #expect(reads)
        #expect(!readsDone)
    }
}
