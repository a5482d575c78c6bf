import GatewayConfig
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// Upstream connections on `EmbeddedChannel`s of the client's own loop: the test reads what the
/// proxy writes upstream (`readOutbound`) and answers with raw bytes (`writeInbound`).
final class EmbeddedConnector: UpstreamConnector {
    let loop: EmbeddedEventLoop
    /// Every connection opened, oldest first.
    private(set) var opened: [EmbeddedChannel] = []
    private(set) var idle: [UpstreamConnection] = []
    /// With `manual`, `connect` waits for the test (`pending`).
    var manual = false
    /// The first connection opened closes itself on the flush after this many (nil: never).
    var closeOnFlush: Int? = nil
    private(set) var pending: [EventLoopPromise<NIOLoopBound<UpstreamConnection>>] = []

    init(loop: EmbeddedEventLoop) { self.loop = loop }

    private var clients: UInt64 = 0
    /// The client connections that closed.
    private(set) var closedClients: [UInt64] = []

    func takeIdle(_ address: UpstreamAddress, for principal: UpstreamPrincipal) -> UpstreamConnection? {
        guard let index = idle.lastIndex(where: { $0.principal == principal && $0.isActive }) else { return nil }
        return idle.remove(at: index)
    }

    func connect(_ address: UpstreamAddress, for principal: UpstreamPrincipal?, limit: Int, on loop: any EventLoop,
                 _ done: @escaping (Result<UpstreamConnection, any Error>) -> Void) {
        let promise = self.loop.makePromise(of: NIOLoopBound<UpstreamConnection>.self)
        let bound = NIOLoopBound(done, eventLoop: loop)
        promise.futureResult.whenComplete { result in bound.value(result.map { $0.value }) }
        if manual {
            pending.append(promise)
        } else {
            promise.succeed(open(for: principal))
        }
    }

    func newClient() -> UInt64 {
        clients += 1
        return clients
    }

    func clientClosed(_ id: UInt64) { closedClients.append(id) }

    func open(for principal: UpstreamPrincipal? = .anyone) -> NIOLoopBound<UpstreamConnection> {
        let channel = EmbeddedChannel(loop: loop)
        let connection = UpstreamConnection(address: UpstreamAddress(host: "127.0.0.1", port: 1), principal: principal)
        if opened.isEmpty, let after = closeOnFlush {
            let closer = CloseOnFlush()
            closer.armed = true
            closer.after = after
            try! channel.pipeline.syncOperations.addHandler(closer)
        }
        try! channel.pipeline.syncOperations.addHandler(connection)
        try! channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        opened.append(channel)
        return NIOLoopBound(connection, eventLoop: loop)
    }

    func release(_ connection: UpstreamConnection) {
        guard connection.isActive, connection.reusable, connection.principal != nil else { return connection.close() }
        connection.owner = nil
        connection.reused = true
        idle.append(connection)
    }
}

final class RecordingObserver: ProxyObserver, @unchecked Sendable {
    var records: [ExchangeRecord] = []
    var failures: [UpstreamErrorKind] = []
    var wantsRequestDetails: Bool { false }
    func exchangeCompleted(_ record: ExchangeRecord) { records.append(record) }
    func upstreamFailed(_ kind: UpstreamErrorKind, route: String) { failures.append(kind) }
    func clientConnectionOpened() {}
    func clientConnectionClosed() {}
    func upstreamConnectionOpened(_ upstream: UpstreamAddress) {}
    func upstreamConnectionClosed() {}
}

/// The client connection's state machine driven through its handler on `EmbeddedChannel`s:
/// forwarding, the retry-once rule, timeouts, pipelining and aborts, without a socket.
@Suite("Client connection: forwarding on EmbeddedChannels")
struct ClientConnectionTests {
    struct Fixture {
        let client: EmbeddedChannel
        let connector: EmbeddedConnector
        let observer: RecordingObserver

        var loop: EmbeddedEventLoop { client.embeddedEventLoop }

        func send(_ text: String) throws { try client.writeInbound(ByteBuffer(string: text)) }

        /// Everything the proxy wrote to the client so far.
        func clientOutput() throws -> String { try Self.drain(client) }

        /// Everything the proxy wrote to upstream connection `index` so far.
        func upstreamOutput(_ index: Int) throws -> String { try Self.drain(connector.opened[index]) }

        /// The app answers on upstream connection `index`.
        func answer(_ index: Int, _ text: String) throws {
            try connector.opened[index].writeInbound(ByteBuffer(string: text))
        }

        /// One exchange on connection 0, which goes back to the pool (its output read).
        func poolOneConnection() throws {
            try send("GET /one HTTP/1.1\r\nHost: app\r\n\r\n")
            try answer(0, "HTTP/1.1 204 No Content\r\n\r\n")
            _ = try clientOutput()
            _ = try upstreamOutput(0)
            #expect(connector.idle.count == 1)
        }

        static func drain(_ channel: EmbeddedChannel) throws -> String {
            var text = ""
            while var buffer = try channel.readOutbound(as: ByteBuffer.self) {
                text += buffer.readString(length: buffer.readableBytes) ?? ""
            }
            return text
        }
    }

    static let timeouts = ProxyConfiguration.Timeouts(upstreamConnect: .seconds(1), upstreamResponse: .seconds(5), idle: .seconds(30),
                                                      requestBody: .seconds(10))

    /// `outbound`: a handler between the proxy and the client's socket; `reuse`: the route's
    /// `upstream_reuse` (`shared` sends requests with a body on kept connections too).
    func makeFixture(_ requestGuard: any RequestGuard = ScriptedGuard { _, _ in .verdict(.forward) },
                     outbound: (any ChannelOutboundHandler & Sendable)? = nil, reuse: GatewayConfiguration.UpstreamReuse = .principal) throws -> Fixture {
        let client = EmbeddedChannel()
        let routes = [ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1), requestGuard: requestGuard, upstreamReuse: reuse)]
        let snapshot = RoutingSnapshot(routes: routes, identityHeaders: ["X-Auth-User"], trustedProxies: [])
        let configuration = ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0), timeouts: Self.timeouts)
        let observer = RecordingObserver()
        let shared = ProxyShared(snapshot: snapshot, configuration: configuration, observer: observer)
        let connector = EmbeddedConnector(loop: client.embeddedEventLoop)
        // Connected first, as a server's child channel is when its handlers are added.
        try client.connect(to: SocketAddress(ipAddress: "192.0.2.7", port: 4000)).wait()
        if let outbound { try client.pipeline.syncOperations.addHandler(outbound) }
        try client.pipeline.syncOperations.addHandler(ProxyServerHandler(shared: shared, connector: connector))
        return Fixture(client: client, connector: connector, observer: observer)
    }

    @Test("a request goes upstream with the proxy's fields; the response comes back; the connection returns to the pool")
    func forwards() throws {
        let f = try makeFixture()
        try f.send("GET /a?b=1 HTTP/1.1\r\nHost: app\r\nX-Auth-User: forged\r\n\r\n")
        let sent = try f.upstreamOutput(0)
        #expect(sent.hasPrefix("GET /a?b=1 HTTP/1.1\r\nHost: app\r\n"))
        #expect(sent.contains("X-Forwarded-For: 192.0.2.7\r\n"))
        #expect(!sent.lowercased().contains("x-auth-user"), "a client's identity header never reaches the app")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-App: 1\r\n\r\nok")
        let text = try f.clientOutput()
        #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(text.contains("X-App: 1\r\n"))
        #expect(text.hasSuffix("\r\n\r\nok"))
        #expect(f.connector.idle.count == 1, "a complete keep-alive exchange gives its connection back")
        #expect(f.observer.records.map(\.status) == [200])
        #expect(f.client.isActive)
    }

    @Test("pipelined requests: the second goes upstream only after the first response, on the same connection")
    func pipelining() throws {
        let f = try makeFixture()
        try f.send("GET /one HTTP/1.1\r\nHost: app\r\n\r\nGET /two HTTP/1.1\r\nHost: app\r\n\r\n")
        let first = try f.upstreamOutput(0)
        #expect(first.hasPrefix("GET /one "))
        #expect(!first.contains("/two"), "a pipelined request waits for its turn")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none")
        #expect(f.connector.opened.count == 1, "the pooled connection serves the second request")
        #expect(try f.upstreamOutput(0).hasPrefix("GET /two "))
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo")
        let text = try f.clientOutput()
        #expect(text.hasSuffix("one") == false && text.contains("\r\n\r\noneHTTP/1.1 200 OK") && text.hasSuffix("\r\n\r\ntwo"))
    }

    @Test("a pooled connection the app closed before answering: the request is sent once more, on a fresh connection")
    func retryOnce() throws {
        let f = try makeFixture()
        try f.poolOneConnection()
        try f.send("GET /two HTTP/1.1\r\nHost: app\r\n\r\n")
        #expect(try f.upstreamOutput(0).hasPrefix("GET /two "))
        try f.connector.opened[0].close().wait()
        #expect(f.connector.opened.count == 2, "a fresh connection for the retry")
        #expect(try f.upstreamOutput(1).hasPrefix("GET /two "))
        try f.answer(1, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
        #expect(try f.clientOutput().hasPrefix("HTTP/1.1 200 OK\r\n"))

        // The fresh connection failing the same way is the app's answer: 502, no third try.
        try f.send("GET /three HTTP/1.1\r\nHost: app\r\n\r\n")
        try f.connector.opened[1].close().wait()
        #expect(f.connector.opened.count == 3)
        try f.connector.opened[2].close().wait()
        #expect(f.connector.opened.count == 3)
        #expect(try f.clientOutput().hasPrefix("HTTP/1.1 502 Bad Gateway\r\n"))
    }

    @Test("a request with a body is never retried (shared: it went out on a kept connection): 502")
    func noRetryWithBody() throws {
        let f = try makeFixture(reuse: .shared)
        try f.poolOneConnection()
        try f.send("PUT /two HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\n\r\nabc")
        #expect(try f.upstreamOutput(0).hasSuffix("\r\n\r\nabc"))
        try f.connector.opened[0].close().wait()
        #expect(f.connector.opened.count == 1)
        #expect(try f.clientOutput().hasPrefix("HTTP/1.1 502 Bad Gateway\r\n"))
        #expect(f.observer.failures == [.closedBeforeResponse])
    }

    @Test("the app does not answer within upstream_response: 504, and its connection is closed")
    func responseTimeout() throws {
        let f = try makeFixture()
        try f.send("GET /slow HTTP/1.1\r\nHost: app\r\n\r\n")
        f.loop.advanceTime(by: Self.timeouts.upstreamResponse - .milliseconds(10))
        #expect(try f.clientOutput().isEmpty)
        f.loop.advanceTime(by: .milliseconds(20))
        #expect(try f.clientOutput().hasPrefix("HTTP/1.1 504 Gateway Timeout\r\n"))
        #expect(!f.connector.opened[0].isActive)
        #expect(f.observer.failures == [.responseTimeout])
        #expect(f.client.isActive, "the client's connection is kept")
    }

    @Test("connecting fails: 504 for a timeout, 502 for a refusal")
    func connectFailures() throws {
        for (error, status) in [(ChannelError.connectTimeout(.seconds(1)) as any Error, "504"), (ChannelError.ioOnClosedChannel, "502")] {
            let f = try makeFixture()
            f.connector.manual = true
            try f.send("GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
            #expect(try f.clientOutput().isEmpty)
            f.connector.pending[0].fail(error)
            #expect(try f.clientOutput().hasPrefix("HTTP/1.1 \(status) "))
        }
    }

    @Test("a connection that arrives after the client left is closed, not used")
    func lateConnection() throws {
        let f = try makeFixture()
        f.connector.manual = true
        try f.send("GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
        try f.client.close().wait()
        f.connector.pending[0].succeed(f.connector.open())
        #expect(!f.connector.opened[0].isActive)
        #expect(try f.upstreamOutput(0).isEmpty, "nothing was written on it")
    }

    @Test("the app's connection breaks mid-response: the client's connection is aborted, never completed")
    func abortMidResponse() throws {
        let f = try makeFixture()
        try f.send("GET /big HTTP/1.1\r\nHost: app\r\n\r\n")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
        try f.connector.opened[0].close().wait()
        let text = try f.clientOutput()
        #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n") && text.hasSuffix("12345"))
        #expect(!f.client.isActive)
        #expect(f.observer.records.map(\.aborted) == [true])
        #expect(f.observer.failures == [.resetDuringResponse])
    }

    @Test("bytes that are not a response, after the response started: aborted, never relayed as if complete")
    func invalidMidResponse() throws {
        let f = try makeFixture()
        try f.send("GET /chunks HTTP/1.1\r\nHost: app\r\n\r\n")
        try f.answer(0, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n")
        let text = try f.clientOutput()
        #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n") && text.hasSuffix("3\r\nabc\r\n"), "the good chunk only")
        #expect(!text.contains("0\r\n\r\n"), "never the last chunk")
        #expect(!f.client.isActive)
        #expect(!f.connector.opened[0].isActive)
        #expect(f.observer.failures == [.invalidResponse])
        #expect(f.observer.records.map(\.aborted) == [true])
    }

    @Test("a body sent while the verdict is pending goes upstream after the head, in order")
    func bufferedBody() throws {
        let box = PromiseBox()
        let f = try makeFixture(ScriptedGuard.later(box))
        try f.send("POST /up HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        try f.send("2\r\nde\r\n0\r\n\r\n")
        #expect(f.connector.opened.isEmpty)
        box.promise?.succeed(.forward)
        let sent = try f.upstreamOutput(0)
        #expect(sent.hasPrefix("POST /up HTTP/1.1\r\n"))
        #expect(sent.hasSuffix("\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"))
    }

    @Test("the verdict never comes: 503 after the idle timeout, and a late verdict is discarded")
    func verdictTimeout() throws {
        let box = PromiseBox()
        let f = try makeFixture(ScriptedGuard.later(box))
        try f.send("GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
        f.loop.advanceTime(by: Self.timeouts.idle + .milliseconds(1))
        #expect(try f.clientOutput().hasPrefix("HTTP/1.1 503 Service Unavailable\r\n"))
        box.promise?.succeed(.forward)
        #expect(f.connector.opened.isEmpty, "a verdict for an answered exchange forwards nothing")
    }

    @Test("a request body that stops arriving: 408 after request_body, and the half-sent request's upstream connection is closed")
    func bodyTimeout() throws {
        let f = try makeFixture()
        try f.send("POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: 100\r\n\r\nabc")
        #expect(f.connector.opened.count == 1)
        f.loop.advanceTime(by: Self.timeouts.requestBody + .milliseconds(1))
        #expect(try f.clientOutput().hasPrefix("HTTP/1.1 408 Request Timeout\r\n"))
        #expect(!f.connector.opened[0].isActive)
    }
}

/// Closes its channel on a flush, once armed (a client that resets while a response is written:
/// NIO fails the write and closes inside the flush).
final class CloseOnFlush: ChannelOutboundHandler, @unchecked Sendable {
    typealias OutboundIn = ByteBuffer
    var armed = false
    /// Flushes let through before closing.
    var after = 0
    func flush(context: ChannelHandlerContext) {
        guard armed else { return context.flush() }
        if after > 0 {
            after -= 1
            return context.flush()
        }
        armed = false
        context.close(promise: nil)
    }
}

final class LeaseCount: @unchecked Sendable {
    var ended = 0
}

/// What re-entrancy through a failing flush does (found in review): NIO closes a channel inside
/// the flush whose write failed, so the handler's callbacks run inside its own actions.
@Suite("Client connection: re-entrancy and stalls")
struct ClientConnectionReentrancyTests {
    @Test("the client leaves while the app's 101 is written: the app's connection closes, the exchange is aborted, the lease ends once")
    func clientGoneDuringUpgrade() throws {
        let leases = LeaseCount()
        let closer = CloseOnFlush()
        let f = try ClientConnectionTests().makeFixture(ScriptedGuard { _, _ in
            .verdict(.forward(addHeaders: [], tunnel: TunnelLease { _ in leases.ended += 1 }))
        }, outbound: closer)
        try f.send("GET /ws HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        #expect(try f.upstreamOutput(0).hasPrefix("GET /ws "))
        closer.armed = true
        try f.answer(0, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        f.loop.run()
        #expect(!f.client.isActive)
        #expect(!f.connector.opened[0].isActive, "the app's side of a tunnel that never was must close")
        #expect(f.observer.records.map(\.aborted) == [true])
        #expect(leases.ended == 1)
    }

    @Test("a pipelined request behind one whose reused connection fails at its first flush is still served (shared)")
    func pumpAfterFailedFlush() throws {
        let f = try ClientConnectionTests().makeFixture(reuse: .shared)
        f.connector.closeOnFlush = 1  // connection 0: its 2nd flush fails (the app reset it while idle)
        try f.send("GET /1 HTTP/1.1\r\nHost: app\r\n\r\nPOST /2 HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\n\r\nabcGET /3 HTTP/1.1\r\nHost: app\r\n\r\n")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        f.loop.run()
        let text = try f.clientOutput()
        #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(text.contains("HTTP/1.1 502 Bad Gateway\r\n"), "POST /2 has a body: never retried")
        try #require(f.connector.opened.count == 2, "the request behind it must not be stranded")
        #expect(try f.upstreamOutput(1).hasPrefix("GET /3 "))
    }

    @Test("a client that never reads cannot keep a closing connection open: closed after the idle timeout")
    func closingNeverHangs() throws {
        let f = try ClientConnectionTests().makeFixture(outbound: StallWrites())
        try f.send("GET /x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
        #expect(f.client.isActive, "the last write is still pending")
        f.loop.advanceTime(by: ClientConnectionTests.timeouts.idle + .seconds(1))
        #expect(!f.client.isActive)
    }

    @Test("time the gateway holds the client back is not the body's, even when the body's clock starts while a read is held")
    func heldReadCountedForPipelinedBody() throws {
        let box = PromiseBox()
        let f = try ClientConnectionTests().makeFixture(ScriptedGuard.later(box) { $0.target.path == "/2" })
        try f.send("GET /1 HTTP/1.1\r\nHost: app\r\n\r\nPOST /2 HTTP/1.1\r\nHost: app\r\nContent-Length: 10\r\n\r\nabc")
        f.client.read()  // NIO asks to read while /1 is served: held
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        // /2 waits for its verdict longer than request_body: the gateway's time, not the client's.
        f.loop.advanceTime(by: ClientConnectionTests.timeouts.requestBody + .seconds(1))
        #expect(!(try f.clientOutput().contains(" 408 ")), "no 408 (the request ids are random hex: a bare \"408\" once matched one)")
        box.promise?.succeed(.forward)
        #expect(f.client.isActive)
    }
}

/// Holds every write's promise forever (a client that stopped reading).
final class StallWrites: ChannelOutboundHandler, @unchecked Sendable {
    typealias OutboundIn = ByteBuffer
    var promises: [EventLoopPromise<Void>] = []
    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if let promise { promises.append(promise) }
    }
    func flush(context: ChannelHandlerContext) {}
}

@Suite("Client connection: upstream connections bound to one principal")
struct PrincipalBindingTests {
    @Test("principal: an anonymous client's GETs share one kept connection; a request with a body gets its own, told Connection: close, closed after; the client's close is reported")
    func bodyGetsItsOwnConnection() throws {
        let f = try ClientConnectionTests().makeFixture()
        try f.send("GET /1 HTTP/1.1\r\nHost: app\r\n\r\n")
        #expect(!(try f.upstreamOutput(0)).lowercased().contains("connection: close"))
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        try f.send("POST /2 HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\n\r\nabc")
        try #require(f.connector.opened.count == 2, "a body never goes out on a kept connection")
        let post = try f.upstreamOutput(1)
        #expect(post.contains("\r\nConnection: close\r\n"))
        #expect(post.hasSuffix("\r\n\r\nabc"))
        try f.answer(1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        #expect(!f.connector.opened[1].isActive, "closed after its one request")
        try f.send("GET /3 HTTP/1.1\r\nHost: app\r\n\r\n")
        #expect(f.connector.opened.count == 2, "the GET takes the client's kept connection")
        #expect(try f.upstreamOutput(0).hasPrefix("GET /3 "))
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        try f.client.close().wait()
        #expect(f.connector.closedClients == [1])
    }

    @Test("any byte on an idle kept connection closes it (shared mode too): the next request opens a fresh one")
    func idleBytesClose() throws {
        let f = try ClientConnectionTests().makeFixture(reuse: .shared)
        try f.send("GET /1 HTTP/1.1\r\nHost: app\r\n\r\n")
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        #expect(f.connector.opened[0].isActive, "kept after a well-framed response")
        // The app speaks while nobody asked: a second response, sent late.
        try f.answer(0, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nlate!")
        #expect(!f.connector.opened[0].isActive)
        try f.send("GET /2 HTTP/1.1\r\nHost: app\r\n\r\n")
        #expect(f.connector.opened.count == 2)
        #expect(try f.upstreamOutput(1).hasPrefix("GET /2 "))
    }

    @Test("principal: two users on one loop never take each other's kept connection")
    func usersDoNotShare() throws {
        let f = try ClientConnectionTests().makeFixture(ScriptedGuard { request, _ in
            .verdict(.forward(addHeaders: [], user: request.firstValue(named: "x-user")))
        })
        for (index, user) in ["alice", "bob", "alice"].enumerated() {
            try f.send("GET /\(index) HTTP/1.1\r\nHost: app\r\nX-User: \(user)\r\n\r\n")
            try f.answer(user == "alice" ? 0 : 1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        }
        #expect(f.connector.opened.count == 2)
        #expect(f.connector.opened.map { $0.isActive } == [true, true])
        #expect(try f.upstreamOutput(1).hasPrefix("GET /1 "), "bob's request went out on a connection of its own")
    }
}
