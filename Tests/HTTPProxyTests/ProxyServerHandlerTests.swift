import GatewayConfig
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import HTTPProxy

/// A guard whose decision the test scripts.
struct ScriptedGuard: RequestGuard {
    let decide: @Sendable (GuardRequest, any EventLoop) -> GuardDecision
    func admit(_ request: GuardRequest, on eventLoop: any EventLoop) -> GuardDecision { decide(request, eventLoop) }

    /// A verdict that comes later, for the requests `when` picks (the others are forwarded at
    /// once): the test completes `box.promise`.
    static func later(_ box: PromiseBox, when: @escaping @Sendable (GuardRequest) -> Bool = { _ in true }) -> ScriptedGuard {
        ScriptedGuard { request, loop in
            guard when(request) else { return .verdict(.forward) }
            let promise = loop.makePromise(of: Verdict.self)
            box.promise = promise
            return .pending(promise.futureResult)
        }
    }
}

/// Counts `read()` calls that reach the head of the pipeline (i.e. that the proxy let through).
final class ReadCounter: ChannelOutboundHandler {
    typealias OutboundIn = ByteBuffer
    var reads = 0
    func read(context: ChannelHandlerContext) {
        reads += 1
        context.read()
    }
}

@Suite("ProxyServerHandler on an EmbeddedChannel")
struct ProxyServerHandlerTests {
    struct Fixture {
        let channel: EmbeddedChannel
        let reads: ReadCounter
    }

    func makeChannel(_ requestGuard: any RequestGuard) throws -> Fixture {
        let channel = EmbeddedChannel()
        let routes = [ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1), requestGuard: requestGuard)]
        let snapshot = RoutingSnapshot(routes: routes, identityHeaders: ["X-Auth-User"], trustedProxies: [])
        let configuration = ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0))
        let shared = ProxyShared(snapshot: snapshot, configuration: configuration, observer: SilentProxyObserver())
        let pool = UpstreamPool(eventLoop: channel.eventLoop, connectTimeout: .seconds(1), idleTimeout: .seconds(60), observer: SilentProxyObserver())
        let reads = ReadCounter()
        try channel.pipeline.syncOperations.addHandler(reads)
        try channel.pipeline.syncOperations.addHandler(ProxyServerHandler(shared: shared, connector: pool))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()
        return Fixture(channel: channel, reads: reads)
    }

    func output(_ channel: EmbeddedChannel) throws -> String {
        var text = ""
        while var buffer = try channel.readOutbound(as: ByteBuffer.self) {
            text += buffer.readString(length: buffer.readableBytes) ?? ""
        }
        return text
    }

    @Test("a verdict that comes at once is answered in the same read")
    func immediateVerdict() throws {
        let f = try makeChannel(ScriptedGuard { _, _ in .verdict(.respond(.error(.forbidden, "not you"))) })
        try f.channel.writeInbound(ByteBuffer(string: "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"))
        let text = try output(f.channel)
        #expect(text.hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
        #expect(text.hasSuffix("403 Forbidden: not you\n"))
        #expect(!text.contains("connection: close"))
        #expect(f.channel.isActive)
    }

    @Test("a kept-alive connection keeps its routes until a reload, and its next request after one sees the new routes and trust")
    func reloadReachesKeptConnections() throws {
        func snapshot(_ answer: String, trusting: [CIDR]) -> RoutingSnapshot {
            let answering = ScriptedGuard { _, _ in .verdict(.respond(LocalResponse(status: .ok, body: ByteBuffer(string: answer)))) }
            return RoutingSnapshot(routes: [ProxyRoute(name: "r", upstream: UpstreamAddress(host: "127.0.0.1", port: 1), requestGuard: answering)],
                                   identityHeaders: ["X-Auth-User"], trustedProxies: trusting)
        }
        let channel = EmbeddedChannel()
        let shared = ProxyShared(snapshot: snapshot("one", trusting: []), configuration: ProxyConfiguration(listen: ListenAddress(host: "127.0.0.1", port: 0)),
                                 observer: SilentProxyObserver())
        let pool = UpstreamPool(eventLoop: channel.eventLoop, connectTimeout: .seconds(1), idleTimeout: .seconds(60), observer: SilentProxyObserver())
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 4000)).wait()  // the peer is known when the handler comes
        try channel.pipeline.syncOperations.addHandler(ProxyServerHandler(shared: shared, connector: pool))
        // A trusted proxy's request id is kept (the answer carries it); an untrusted peer's is not.
        let request = "GET /x HTTP/1.1\r\nHost: a\r\nX-Request-Id: from-the-proxy\r\n\r\n"
        for _ in 0..<2 {
            try channel.writeInbound(ByteBuffer(string: request))
            let answer = try output(channel)
            #expect(answer.hasSuffix("one") && !answer.contains("from-the-proxy"), "\(answer)")
        }
        shared.replace(snapshot("two", trusting: CIDR.loopback))
        try channel.writeInbound(ByteBuffer(string: request))
        let answer = try output(channel)
        #expect(answer.hasSuffix("two") && answer.contains("x-request-id: from-the-proxy"), "the reload's routes, and the peer trusted under them: \(answer)")
    }

    @Test("a verdict that comes later: nothing is read or written until it arrives")
    func deferredVerdict() throws {
        let promiseBox = PromiseBox()
        let f = try makeChannel(ScriptedGuard.later(promiseBox))
        try f.channel.writeInbound(ByteBuffer(string: "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"))
        let readsBefore = f.reads.reads
        f.channel.read()
        f.channel.read()
        #expect(f.reads.reads == readsBefore, "the client must not be read while the verdict is pending")
        #expect(try output(f.channel).isEmpty)

        let promise = try #require(promiseBox.promise)
        promise.succeed(.respond(.error(.unauthorized, "sign in")))
        let text = try output(f.channel)
        #expect(text.hasPrefix("HTTP/1.1 401 Unauthorized\r\n"))
        #expect(f.reads.reads == readsBefore + 1, "the held read is released with the verdict")
    }

    @Test("a failed admission is a 503, not a forward")
    func failedAdmission() throws {
        struct Boom: Error {}
        let f = try makeChannel(ScriptedGuard { _, loop in .pending(loop.makeFailedFuture(Boom())) })
        try f.channel.writeInbound(ByteBuffer(string: "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"))
        #expect(try output(f.channel).hasPrefix("HTTP/1.1 503 Service Unavailable\r\n"))
    }

    @Test("the guard sees the canonical target and the client's own headers")
    func guardInput() throws {
        let seen = SeenBox()
        let f = try makeChannel(ScriptedGuard { request, _ in
            seen.path = request.target.path
            seen.cookie = request.head.headers.first(name: "cookie")
            return .verdict(.respond(.error(.forbidden, "x")))
        })
        try f.channel.writeInbound(ByteBuffer(string: "GET /a/%2e%2e/b?q HTTP/1.1\r\nHost: a\r\nCookie: c=1\r\n\r\n"))
        #expect(seen.path == "/b")
        #expect(seen.cookie == "c=1")
    }

    @Test("pipelined requests answered locally come back in order")
    func pipelinedLocal() throws {
        let f = try makeChannel(ScriptedGuard { request, _ in .verdict(.respond(.error(.forbidden, request.target.path))) })
        try f.channel.writeInbound(ByteBuffer(string: "GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\nGET /three HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
        let text = try output(f.channel)
        let bodies = text.components(separatedBy: "\r\n\r\n").dropFirst().map { $0.prefix { $0 != "\n" } }
        #expect(bodies.map(String.init) == ["403 Forbidden: /one", "403 Forbidden: /two", "403 Forbidden: /three"])
        #expect(text.contains("connection: close"))
    }

    @Test("a malformed request gets 400 and the connection closes")
    func malformed() throws {
        let f = try makeChannel(ScriptedGuard { _, _ in .verdict(.forward) })
        _ = try? f.channel.writeInbound(ByteBuffer(string: "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n"))
        f.channel.embeddedEventLoop.run()
        #expect(try output(f.channel).hasPrefix("HTTP/1.1 400 Bad Request\r\n"))
        #expect(!f.channel.isActive)
    }

    @Test("a closed connection's handler is freed (it once kept itself alive through its context: ~2 KiB per connection, forever)")
    func freedAfterClose() throws {
        weak var handler: ProxyServerHandler?
        weak var channel: EmbeddedChannel?
        do {
            let f = try makeChannel(ScriptedGuard { _, _ in .verdict(.respond(.error(.forbidden, "no"))) })
            handler = try f.channel.pipeline.syncOperations.handler(type: ProxyServerHandler.self)
            channel = f.channel
            #expect(handler != nil)
            try f.channel.writeInbound(ByteBuffer(string: "GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
            f.channel.embeddedEventLoop.run()
            #expect(try output(f.channel).hasPrefix("HTTP/1.1 403 Forbidden\r\n"))
            #expect(!f.channel.isActive)
            _ = try? f.channel.finish()
        }
        #expect(handler == nil, "the handler outlived its closed connection")
        #expect(channel == nil, "a timer of the closed connection (the lingering close's bound) still holds it")
    }
}

final class PromiseBox: @unchecked Sendable {
    var promise: EventLoopPromise<Verdict>?
}

final class SeenBox: @unchecked Sendable {
    var path: String?
    var cookie: String?
}
