import GatewayConfig
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// The exchange alone, as a table: a state, an event, the one action and the state after.
@Suite("ExchangeStateMachine: (state, event) → (action, state)")
struct ExchangeStateMachineTests {
    typealias X = ExchangeStateMachine
    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)
    static let responseTimeout = TimeAmount.seconds(5)
    static let bodyAllowance = TimeAmount.seconds(10)
    static let loop = EmbeddedEventLoop()

    /// The states an exchange can be in, each reached from its head by real events.
    enum Stage: String, CaseIterable, Sendable {
        case verdict = "a GET waiting for its verdict"
        case verdictMidBody = "a POST waiting for its verdict, 5 of its 10 body bytes in"
        case collecting = "a POST whose body an endpoint collects"
        case answering = "an endpoint answering"
        case connecting = "a GET waiting for its upstream connection"
        case forwarding = "a GET sent, its response awaited"
        case forwardingMidBody = "a POST forwarding its body"
        case relaying = "a response being relayed"
        case ended = "a response complete"
    }

    enum Event: String, Sendable {
        case body = "5 body bytes"
        case end = "the request's end"
        case forward = "the verdict forward"
        case refuse = "the verdict 403"
        case collect = "the verdict collect the body"
        case guardFailed = "the guard failing"
        case answered = "the endpoint's answer"
        case connected = "an upstream connection"
        case connectTimeout = "a connect timeout"
        case connectRefused = "a refused connection"
        case head200 = "a 200 head with a length"
        case head200Unframed = "a 200 head without a length"
        case head100 = "a 100 Continue"
        case head101 = "a 101"
        case headInvalid = "a status outside 100–599"
        case upstreamBody = "response body bytes"
        case upstreamEnd = "the response's end"
        case upstreamGone = "the upstream closing"
        case upstreamGarbage = "the upstream sending what is not HTTP"
        case responseDeadline = "the response deadline"
        case bodyDeadline = "the body deadline"
        case idle = "the idle timeout"
        case clientLeft = "the client leaving"
    }

    /// An exchange taken to a stage, with the connection it was given (if any).
    struct Fixture {
        let route: ProxyRoute
        let rules: RequestHeaderRules
        let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
        var x: X
        var upstreamHead = ByteBuffer()

        init(_ stage: Stage) throws {
            route = ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1))
            let snapshot = RoutingSnapshot(routes: [route], identityHeaders: [], trustedProxies: [])
            rules = snapshot.rules
            let post = [.verdictMidBody, .collecting, .answering, .forwardingMidBody].contains(stage)
            let text = post ? "POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n" : "GET /g HTTP/1.1\r\nHost: a\r\n\r\n"
            let head = try ExchangeStateMachineTests.head(text, kind: .request)
            guard case .admitted(let admitted) = Admission.admit(head, snapshot: snapshot, peerTrusted: false) else { throw CancellationError() }
            let log = ExchangeLog(method: head.method, version: head.version, start: t0, path: head.target, requestID: "id")
            x = X(id: 1, log: log, admitted: admitted, now: t0)
            let first: ByteBuffer = post ? ByteBuffer(string: "01234") : ByteBuffer()
            _ = x.requestPart(post ? .body(first) : .end(nil), now: t0, responseTimeout: responseTimeout)
            switch stage {
            case .verdict, .verdictMidBody: return
            case .collecting, .answering:
                _ = x.verdict(.success(.collectBody(maxBytes: 100, respond: { _ in loop.makeSucceededFuture(.error(.ok, "fine")) })),
                              client: Self.client, allocator: ByteBufferAllocator(), now: t0)
                if stage == .answering {
                    _ = x.requestPart(.body(ByteBuffer(string: "56789")), now: t0, responseTimeout: responseTimeout)
                    _ = x.requestPart(.end(nil), now: t0, responseTimeout: responseTimeout)
                }
                return
            default: break
            }
            guard case .connect = x.verdict(.success(.forward), client: Self.client, allocator: ByteBufferAllocator(), now: t0) else {
                throw CancellationError()
            }
            if case .connecting(let forward, _) = x.state { upstreamHead = forward.head }
            if stage == .connecting { return }
            _ = x.connected(.success(connection), now: t0, responseTimeout: responseTimeout)
            if stage == .forwarding || stage == .forwardingMidBody { return }
            _ = x.upstreamPart(.head(try ExchangeStateMachineTests.head("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", kind: .response)), now: t0)
            if stage == .relaying { return }
            _ = x.upstreamPart(.end(nil), now: t0)
        }

        static let client = X.Client(id: 7, address: "192.0.2.1", trusted: false, scheme: "http")

        mutating func run(_ event: Event) throws -> X.Action {
            let now = t0 + .seconds(1)
            switch event {
            case .body: return x.requestPart(.body(ByteBuffer(string: "abcde")), now: now, responseTimeout: responseTimeout)
            case .end: return x.requestPart(.end(nil), now: now, responseTimeout: responseTimeout)
            case .forward: return x.verdict(.success(.forward), client: Self.client, allocator: ByteBufferAllocator(), now: now)
            case .refuse:
                return x.verdict(.success(.respond(.error(.forbidden, "no"))), client: Self.client, allocator: ByteBufferAllocator(), now: now)
            case .collect:
                return x.verdict(.success(.collectBody(maxBytes: 100, respond: { _ in loop.makeSucceededFuture(.error(.ok, "fine")) })),
                                 client: Self.client, allocator: ByteBufferAllocator(), now: now)
            case .guardFailed:
                return x.verdict(.failure(ChannelError.ioOnClosedChannel), client: Self.client, allocator: ByteBufferAllocator(), now: now)
            case .answered: return x.answered(.success(.error(.ok, "fine")))
            case .connected: return x.connected(.success(connection), now: now, responseTimeout: responseTimeout)
            case .connectTimeout:
                return x.connected(.failure(ChannelError.connectTimeout(.seconds(1))), now: now, responseTimeout: responseTimeout)
            case .connectRefused: return x.connected(.failure(ChannelError.ioOnClosedChannel), now: now, responseTimeout: responseTimeout)
            case .head200: return x.upstreamPart(.head(try head("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", kind: .response)), now: now)
            case .head200Unframed: return x.upstreamPart(.head(try head("HTTP/1.1 200 OK\r\n\r\n", kind: .response)), now: now)
            case .head100: return x.upstreamPart(.head(try head("HTTP/1.1 100 Continue\r\n\r\n", kind: .response)), now: now)
            case .head101: return x.upstreamPart(.head(try head("HTTP/1.1 101 Switching Protocols\r\n\r\n", kind: .response)), now: now)
            case .headInvalid: return x.upstreamPart(.head(try head("HTTP/1.1 999 Odd\r\n\r\n", kind: .response)), now: now)
            case .upstreamBody: return x.upstreamPart(.body(ByteBuffer(string: "ok")), now: now)
            case .upstreamEnd: return x.upstreamPart(.end(nil), now: now)
            case .upstreamGone: return x.upstreamClosed(nil)
            case .upstreamGarbage: return x.upstreamClosed(WireError.malformed("junk"))
            case .responseDeadline: return x.timerFired(now: t0 + responseTimeout, bodyAllowance: bodyAllowance)
            case .bodyDeadline: return x.timerFired(now: t0 + bodyAllowance, bodyAllowance: bodyAllowance)
            case .idle: return x.idleTimeout()
            case .clientLeft: return x.clientLeft()
            }
        }

        func head(_ text: String, kind: HeadParser.Kind) throws -> WireHead { try ExchangeStateMachineTests.head(text, kind: kind) }
    }

    static func head(_ text: String, kind: HeadParser.Kind) throws -> WireHead {
        var parser = HeadParser(kind: kind, maxHeadBytes: 4096, maxFields: 50)
        var bytes = ByteBuffer(string: text)
        return try #require(try parser.parse(&bytes))
    }

    /// The state's name, as the table writes it.
    static func name(_ state: X.State) -> String {
        switch state {
        case .awaitingVerdict(_, let waiting): return "awaitingVerdict(\(waiting.count) waiting)"
        case .collecting(let c): return "collecting(\(c.body.readableBytes) bytes)"
        case .answering: return "answering"
        case .connecting(let f, let waiting): return "connecting(\(waiting.count) waiting\(f.retried ? ", retry" : ""))"
        case .forwarding(_, _, .awaited(let deadline)): return deadline == nil ? "forwarding" : "forwarding(deadline)"
        case .forwarding(_, _, .relaying(let framing, _)): return "relaying(\(framing))"
        case .ended: return "ended"
        }
    }

    struct Row: Sendable, CustomTestStringConvertible {
        let stage: Stage
        let event: Event
        let after: String
        let expected: @Sendable (Fixture) -> X.Action
        var testDescription: String { "\(stage.rawValue) + \(event.rawValue) → \(after)" }
        init(_ stage: Stage, _ event: Event, _ after: String, _ expected: @escaping @Sendable (Fixture) -> X.Action) {
            self.stage = stage
            self.event = event
            self.after = after
            self.expected = expected
        }
    }

    static let gone = LocalResponse.error(.badGateway, "upstream closed the connection before responding")

    static let rows: [Row] = [
        // The guard is deciding: body parts wait, each verdict is applied once.
        Row(.verdictMidBody, .body, "awaitingVerdict(2 waiting)") { _ in .none },
        Row(.verdictMidBody, .end, "awaitingVerdict(2 waiting)") { _ in .none },
        Row(.verdict, .forward, "connecting(1 waiting)") { f in .connect(f.route, principal: .client(7), pooled: true) },
        Row(.verdictMidBody, .forward, "connecting(1 waiting)") { f in .connect(f.route, principal: nil, pooled: false) },
        Row(.verdict, .refuse, "ended") { _ in .respond(.error(.forbidden, "no"), upstream: nil, failure: nil) },
        Row(.verdict, .guardFailed, "ended") { _ in .respond(.error(.serviceUnavailable, "admission could not be decided"), upstream: nil, failure: nil) },
        Row(.verdictMidBody, .collect, "collecting(5 bytes)") { _ in .none },
        Row(.verdict, .answered, "awaitingVerdict(1 waiting)") { _ in .none },
        Row(.verdict, .connected, "awaitingVerdict(1 waiting)") { f in .closeUpstream(f.connection) },
        Row(.verdict, .upstreamEnd, "awaitingVerdict(1 waiting)") { _ in .none },
        Row(.verdict, .idle, "ended") { _ in .respond(.error(.serviceUnavailable, "admission could not be decided in time", close: true), upstream: nil, failure: nil) },
        Row(.verdictMidBody, .bodyDeadline, "ended") { _ in
            .respond(.error(.requestTimeout, "the request body did not arrive within server.timeouts.request_body", close: true), upstream: nil, failure: nil)
        },
        Row(.verdict, .bodyDeadline, "awaitingVerdict(1 waiting)") { _ in .none },
        Row(.verdict, .clientLeft, "ended") { _ in .abort(upstream: nil, failure: nil) },
        // An endpoint collecting its body, then answering.
        Row(.collecting, .body, "collecting(10 bytes)") { _ in .none },
        Row(.collecting, .end, "answering") { _ in .answer(ByteBuffer(string: "01234"), respond: { _ in loop.makeSucceededFuture(.error(.ok, "")) }) },
        Row(.collecting, .forward, "collecting(5 bytes)") { _ in .discard(.forward) },
        Row(.collecting, .idle, "ended") { _ in
            .respond(.error(.requestTimeout, "the request body did not arrive within the idle timeout", close: true), upstream: nil, failure: nil)
        },
        Row(.answering, .answered, "ended") { _ in .respond(.error(.ok, "fine"), upstream: nil, failure: nil) },
        Row(.answering, .body, "answering") { _ in .none },
        // Connecting: the connection, or why there is none.
        Row(.connecting, .connected, "forwarding(deadline)") { f in
            .startForwarding(f.connection, head: f.upstreamHead, chunked: false, body: [.end(nil)])
        },
        Row(.connecting, .connectTimeout, "ended") { _ in
            .respond(.error(.gatewayTimeout, "upstream did not accept the connection in time"), upstream: nil, failure: .connectTimeout)
        },
        Row(.connecting, .connectRefused, "ended") { _ in .respond(.error(.badGateway, "upstream refused the connection"), upstream: nil, failure: .connectRefused) },
        Row(.connecting, .forward, "connecting(1 waiting)") { _ in .discard(.forward) },
        Row(.connecting, .idle, "ended") { _ in
            .respond(.error(.gatewayTimeout, "no progress within the idle timeout", close: true), upstream: nil, failure: .idleTimeout)
        },
        // Forwarding: the body goes on, the response comes back.
        Row(.forwardingMidBody, .body, "forwarding") { f in .forwardBody(f.connection, ByteBuffer(string: "abcde")) },
        Row(.forwardingMidBody, .end, "forwarding(deadline)") { f in .forwardEnd(f.connection) },
        Row(.forwarding, .head200, "relaying(raw)") { f in
            .relayHead(ResponseHead(try! head("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", kind: .response)), .raw, rules: f.rules)
        },
        Row(.forwarding, .head200Unframed, "relaying(chunked)") { f in
            .relayHead(ResponseHead(try! head("HTTP/1.1 200 OK\r\n\r\n", kind: .response)), .chunked, rules: f.rules)
        },
        Row(.forwarding, .head100, "forwarding(deadline)") { _ in .interim(status: 100) },
        Row(.forwarding, .head101, "ended") { f in .respond(.error(.badGateway, "upstream switched protocols unasked"), upstream: f.connection, failure: .closedBeforeResponse) },
        Row(.forwarding, .headInvalid, "ended") { f in
            .respond(.error(.badGateway, "upstream answered with an invalid status"), upstream: f.connection, failure: .invalidResponse)
        },
        Row(.forwarding, .responseDeadline, "ended") { f in
            .respond(.error(.gatewayTimeout, "upstream did not respond in time"), upstream: f.connection, failure: .responseTimeout)
        },
        Row(.forwardingMidBody, .responseDeadline, "forwarding") { _ in .none },
        Row(.forwarding, .upstreamGone, "ended") { _ in .respond(gone, upstream: nil, failure: .closedBeforeResponse) },
        Row(.forwarding, .upstreamGarbage, "ended") { _ in
            .respond(.error(.badGateway, "upstream response refused: junk"), upstream: nil, failure: .invalidResponse)
        },
        Row(.forwarding, .idle, "ended") { f in .respond(.error(.gatewayTimeout, "no progress within the idle timeout", close: true), upstream: f.connection, failure: .idleTimeout) },
        Row(.forwarding, .clientLeft, "ended") { f in .abort(upstream: f.connection, failure: nil) },
        Row(.forwarding, .connected, "forwarding(deadline)") { f in .closeUpstream(f.connection) },
        // Relaying: body, end, and what cuts a response short.
        Row(.relaying, .upstreamBody, "relaying(raw)") { _ in .relayBody(ByteBuffer(string: "ok"), chunked: false) },
        Row(.relaying, .upstreamEnd, "ended") { f in .finish(lastChunk: false, upstream: f.connection, reuse: true) },
        Row(.relaying, .upstreamGone, "ended") { _ in .abort(upstream: nil, failure: .resetDuringResponse) },
        Row(.relaying, .upstreamGarbage, "ended") { _ in .abort(upstream: nil, failure: .invalidResponse) },
        Row(.relaying, .responseDeadline, "relaying(raw)") { _ in .none },
        Row(.relaying, .idle, "ended") { f in .abort(upstream: f.connection, failure: .idleTimeout) },
        Row(.relaying, .clientLeft, "ended") { f in .abort(upstream: f.connection, failure: nil) },
        // Ended: every late answer finds nothing.
        Row(.ended, .forward, "ended") { _ in .discard(.forward) },
        Row(.ended, .connected, "ended") { f in .closeUpstream(f.connection) },
        Row(.ended, .answered, "ended") { _ in .none },
        Row(.ended, .upstreamBody, "ended") { _ in .none },
        Row(.ended, .upstreamGone, "ended") { _ in .none },
        Row(.ended, .idle, "ended") { _ in .none },
        Row(.ended, .responseDeadline, "ended") { _ in .none },
    ]

    @Test("each state and event gives one action and one next state", arguments: rows)
    func transition(_ row: Row) throws {
        var f = try Fixture(row.stage)
        let action = try f.run(row.event)
        #expect(action == row.expected(f))
        #expect(Self.name(f.x.state) == row.after)
    }

    @Test("every stage of the table is reached by real events, and every stage is in the table")
    func coverage() throws {
        for stage in Stage.allCases {
            _ = try Fixture(stage)
            #expect(Self.rows.contains { $0.stage == stage }, "\(stage.rawValue)")
        }
    }

    @Test("a reused connection closed before any response byte is retried once on a fresh one, then answered 502")
    func retryOnce() throws {
        var f = try Fixture(.forwarding)
        f.connection.reused = true
        #expect(f.x.upstreamClosed(nil) == .connect(f.route, principal: f.connection.principal, pooled: false))
        #expect(Self.name(f.x.state) == "connecting(1 waiting, retry)")
        let fresh = UpstreamConnection(address: f.connection.address)
        fresh.reused = true
        guard case .startForwarding(let connection, _, _, _) = f.x.connected(.success(fresh), now: Self.t0, responseTimeout: Self.responseTimeout),
              connection === fresh else {
            Issue.record("the retry is not forwarded")
            return
        }
        #expect(f.x.upstreamClosed(nil) == .respond(Self.gone, upstream: nil, failure: .closedBeforeResponse))
    }

    @Test("the time the gateway held the client back is not counted against its body")
    func heldTimeIsNotTheClients() throws {
        var f = try Fixture(.verdictMidBody)
        #expect(f.x.bodyDeadline(allowance: Self.bodyAllowance) == Self.t0 + Self.bodyAllowance)
        f.x.readHeld(now: Self.t0 + .seconds(1))
        #expect(f.x.bodyDeadline(allowance: Self.bodyAllowance) == nil, "no deadline runs while held")
        f.x.readResumed(now: Self.t0 + .seconds(4))
        #expect(f.x.bodyDeadline(allowance: Self.bodyAllowance) == Self.t0 + Self.bodyAllowance + .seconds(3))
    }

    @Test("a forwarded exchange holds one of its route's max_in_flight places; a full route answers 503 with Retry-After")
    func maxInFlight() throws {
        let route = ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1), maxInFlight: 1)
        let snapshot = RoutingSnapshot(routes: [route], identityHeaders: [], trustedProxies: [])
        let head = try Self.head("GET / HTTP/1.1\r\nHost: a\r\n\r\n", kind: .request)
        guard case .admitted(let admitted) = Admission.admit(head, snapshot: snapshot, peerTrusted: false) else { throw CancellationError() }
        let log = ExchangeLog(method: .GET, version: .http1_1, start: Self.t0, path: "/", requestID: "id")
        var first = X(id: 1, log: log, admitted: admitted, now: Self.t0)
        var second = X(id: 2, log: log, admitted: admitted, now: Self.t0)
        _ = first.verdict(.success(.forward), client: Fixture.client, allocator: ByteBufferAllocator(), now: Self.t0)
        #expect(first.lease.inFlight === route)
        var full = LocalResponse.error(.serviceUnavailable, "route r has max_in_flight requests in flight; retry shortly")
        full.headers.append(("retry-after", "1"))
        #expect(second.verdict(.success(.forward), client: Fixture.client, allocator: ByteBufferAllocator(), now: Self.t0)
                == .respond(full, upstream: nil, failure: .maxInFlight))
        first.lease.release()
        var third = X(id: 3, log: log, admitted: admitted, now: Self.t0)
        #expect(third.verdict(.success(.forward), client: Fixture.client, allocator: ByteBufferAllocator(), now: Self.t0)
                == .connect(route, principal: .client(7), pooled: true))
        third.lease.release()
    }
}
