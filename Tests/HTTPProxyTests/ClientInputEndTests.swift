import GatewayConfig
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// The client's input ends (its FIN: a half-close, or a close seen as one) — the machine alone.
@Suite("Client connection: the client's input ends (no I/O)")
struct ClientInputEndMachineTests {
    typealias Machine = ClientConnectionStateMachine
    let base = ClientConnectionStateMachineTests()
    var t0: NIODeadline { ClientConnectionStateMachineTests.t0 }

    /// A POST whose head and 10 of its 100 body bytes arrived, taken to `stage`; the upstream
    /// connection, when the stage has one.
    func postMidBody(_ m: inout Machine, stage: String) throws -> (UInt64, UpstreamConnection?) {
        let head = try base.head("POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n")
        guard case .admit(let x, _) = m.requestPart(.head(head), now: t0) else { throw CancellationError() }
        _ = m.requestPart(.body(ByteBuffer(string: "0123456789")), now: t0)
        switch stage {
        case "waiting for the verdict":
            return (x, nil)
        case "collecting for an endpoint":
            let loop = EmbeddedEventLoop()
            _ = m.verdict(.success(.collectBody(maxBytes: 1000, respond: { _ in loop.makeSucceededFuture(.error(.ok, "x")) })), for: x, now: t0)
            return (x, nil)
        case "waiting for the upstream connection":
            _ = m.verdict(.success(.forward), for: x, now: t0)
            return (x, nil)
        default:
            _ = m.verdict(.success(.forward), for: x, now: t0)
            let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1))
            guard case .startForwarding = m.connected(.success(connection), for: x, now: t0) else { throw CancellationError() }
            return (x, connection)
        }
    }

    @Test("the FIN inside a request body ends the exchange at once as the client's abort (499), wherever it stands", arguments: [
        "waiting for the verdict", "collecting for an endpoint", "waiting for the upstream connection", "forwarding the body",
    ])
    func finMidBody(stage: String) throws {
        var m = base.machine()
        let (x, upstream) = try postMidBody(&m, stage: stage)
        _ = x
        guard case .abort(let aborted?, let closing, failure: nil) = m.clientInputClosed(unparsedBytes: false) else {
            Issue.record("\(stage): the truncated request is left open")
            return
        }
        #expect(aborted.log.path == "/up")
        #expect(closing === upstream, "\(stage): the upstream request is torn down with it")
        #expect(aborted.log.status == ExchangeRecord.clientClosedRequest)
        let closed = m.isClosed
        #expect(closed)
        // Nothing is left to time out into a 504.
        guard case .none = m.timerFired(now: t0 + ClientConnectionStateMachineTests.timeouts.idle) else { Issue.record("\(stage): a timer fired"); return }
    }

    @Test("the FIN after a complete request: the request is answered, and its response closes the connection")
    func finAfterCompleteRequest() throws {
        var m = base.machine()
        let x = try base.admitted(&m)
        guard case .none = m.clientInputClosed(unparsedBytes: false) else { Issue.record("a complete request is not aborted"); return }
        guard case .respond(_, _, _, _, .close) = m.verdict(.success(.respond(.error(.forbidden, "no"))), for: x, now: t0) else {
            Issue.record("answered, then closed")
            return
        }
    }

    @Test("the FIN behind pipelined requests: each is answered and keeps the connection; once the reader is drained, it closes")
    func finBehindPipelined() throws {
        var m = base.machine()
        let first = try base.admitted(&m, "/1")
        guard case .none = m.clientInputClosed(unparsedBytes: true) else { Issue.record("the request behind it is still to come"); return }
        guard case .respond(_, _, _, _, .nextRequest) = m.verdict(.success(.respond(.error(.forbidden, "no"))), for: first, now: t0) else {
            Issue.record("closed before the pipelined request")
            return
        }
        let second = try base.admitted(&m, "/2")
        guard case .respond(_, _, _, _, .nextRequest) = m.verdict(.success(.respond(.error(.forbidden, "no"))), for: second, now: t0) else {
            Issue.record("the last request is answered like any other")
            return
        }
        guard case .close(upstream: nil) = m.readerDrained() else { Issue.record("nothing left: not closed"); return }
    }

    @Test("the FIN between requests closes the connection")
    func finBetweenRequests() {
        var m = base.machine()
        guard case .close(upstream: nil) = m.clientInputClosed(unparsedBytes: false) else { Issue.record("not closed"); return }
    }

    @Test("the client resets inside a request body before any response: recorded as the client's abort (499)")
    func resetMidBody() throws {
        var m = base.machine()
        let (_, upstream) = try postMidBody(&m, stage: "forwarding the body")
        guard case .abort(let aborted?, let closing, failure: nil) = m.clientClosed() else { Issue.record("not aborted"); return }
        #expect(aborted.log.path == "/up" && closing === upstream)
        #expect(aborted.log.status == ExchangeRecord.clientClosedRequest)
    }
}

/// The client's input ends — through the handler, on `EmbeddedChannel`s.
@Suite("Client connection: the client's input ends, on EmbeddedChannels")
struct ClientInputEndHandlerTests {
    @Test("a client that half-closes inside a request body: the app's connection is closed at once, no response, no 504 later")
    func finMidBody() throws {
        let f = try ClientConnectionTests().makeFixture()
        try f.send("POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: 100\r\n\r\n0123456789")
        #expect(try f.upstreamOutput(0).hasSuffix("\r\n\r\n0123456789"))
        f.client.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(!f.connector.opened[0].isActive, "the truncated request must not stay open at the app")
        #expect(!f.client.isActive)
        #expect(f.observer.records.map(\.status) == [ExchangeRecord.clientClosedRequest])
        #expect(f.observer.records.map(\.aborted) == [true])
        f.loop.advanceTime(by: ClientConnectionTests.timeouts.idle + .seconds(1))
        #expect(try f.clientOutput().isEmpty)
        #expect(f.observer.failures.isEmpty, "the app is not blamed")
    }

    @Test("a client that half-closes inside a body while the verdict is pending: aborted; the verdict that comes later forwards nothing")
    func finMidBodyDuringVerdict() throws {
        let box = PromiseBox()
        let f = try ClientConnectionTests().makeFixture(ScriptedGuard.later(box))
        try f.send("POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: 100\r\n\r\n0123456789")
        f.client.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(!f.client.isActive)
        #expect(f.observer.records.map(\.status) == [ExchangeRecord.clientClosedRequest])
        box.promise?.succeed(.forward)
        #expect(f.connector.opened.isEmpty)
    }

    @Test("requests pipelined before the client's FIN are all answered, in order; then the connection closes")
    func finBehindPipelined() throws {
        let f = try ClientConnectionTests().makeFixture()
        try f.send("GET /1 HTTP/1.1\r\nHost: app\r\n\r\nGET /2 HTTP/1.1\r\nHost: app\r\n\r\nGET /3 HTTP/1.1\r\nHost: app\r\n\r\n")
        f.client.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        for i in 1...3 {
            #expect(try f.upstreamOutput(0).hasPrefix("GET /\(i) "), "request \(i) reaches the app")
            try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n\(i)")
        }
        let text = try f.clientOutput()
        #expect(text.components(separatedBy: "HTTP/1.1 200 OK\r\n").count == 4, "three answers: \(text)")
        #expect(text.hasSuffix("\r\n\r\n3"))
        f.loop.run()
        #expect(!f.client.isActive, "closed once the last is answered")
    }
}
