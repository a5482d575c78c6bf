import TestSupport
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// A real upstream on loopback whose behaviour is chosen by the request path:
///
/// - `/echo…`: 200 with the request line, headers and body size.
/// - `/download?n=BYTES[&chunked]`: streams `n` bytes with back-pressure.
/// - `/upload[?sum]`: reads the body, answers its length (and with `sum`, a checksum).
/// - `/slow?ms=N`: answers after N ms. `/hang`: never answers.
/// - `/reset`: promises 1000 bytes, sends 10, closes. `/stall`: the same, but stays silent.
/// - `/switch`: 101 to a request that did not ask to upgrade. `/continue`: 100, then 200.
/// - `/flaky`: answers the first request of a connection; closes on any later one unanswered.
/// - `/ws`: WebSocket handshake (101), then echoes bytes.
/// - `/setcookie`: sets the gateway's cookies (and one of its own).
final class TestUpstream: Sendable {
    let channel: any Channel
    let stats = NIOLockedValueBox(Stats())
    private let arrivals = NIOLockedValueBox<[String: [CheckedContinuation<Void, Never>]]>([:])
    /// The answers of `/hold` requests, sent when the test calls `releaseHeld()`.
    let held = NIOLockedValueBox<[@Sendable () -> Void]>([])

    /// Answers every `/hold` request waiting so far.
    func releaseHeld() {
        let answers = held.withLockedValue { all in
            defer { all = [] }
            return all
        }
        answers.forEach { $0() }
    }

    struct Stats {
        var connections = 0
        var requests = 0
        var paths: [String] = []
        /// Requests that arrived whole (their end too).
        var completed: [String] = []
        var lastHeaders: HTTPHeaders = [:]
        /// The trailer section of the last request, as the upstream received it.
        var lastTrailers: HTTPHeaders? = nil
    }

    var port: Int { channel.localAddress!.port! }

    /// Runs `body` with a started upstream (https with `tls`) on `group`'s loops, closed before
    /// this returns or rethrows.
    static func with<Result>(tls: NIOSSLContext? = nil, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                             _ body: (TestUpstream) async throws -> Result) async throws -> Result {
        try await withTeardown(try await start(tls: tls, group: group), stop: { await $0.close() }, body)
    }

    /// With `tls`, it speaks https (the context holds its certificate).
    static func start(tls: NIOSSLContext? = nil, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> TestUpstream {
        let box = NIOLockedValueBox<TestUpstream?>(nil)
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard let upstream = box.withLockedValue({ $0 }) else { throw ChannelError.ioOnClosedChannel }
                    upstream.stats.withLockedValue { $0.connections += 1 }
                    if let tls { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: false, withOutboundHeaderValidation: false)
                    try channel.pipeline.syncOperations.addHandler(TestUpstreamHandler(upstream: upstream))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let upstream = TestUpstream(channel: channel)
        box.withLockedValue { $0 = upstream }
        return upstream
    }

    private init(channel: any Channel) { self.channel = channel }

    func close() async { try? await channel.close() }

    func arrived(_ head: HTTPRequestHead) {
        let path = String(head.uri.split(separator: "?").first ?? "")
        stats.withLockedValue {
            $0.requests += 1
            $0.paths.append(head.uri)
            $0.lastHeaders = head.headers
        }
        let waiters = arrivals.withLockedValue { $0.removeValue(forKey: path) ?? [] }
        waiters.forEach { $0.resume() }
    }

    /// Suspends until a request for `path` reaches the upstream (call before sending it).
    func waitForArrival(of path: String, _ registered: @Sendable () -> Void) async {
        await withCheckedContinuation { continuation in
            arrivals.withLockedValue { $0[path, default: []].append(continuation) }
            registered()
        }
    }
}

final class TestUpstreamHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let upstream: TestUpstream
    private var head: HTTPRequestHead?
    private var bodyBytes = 0
    private var checksum: UInt32 = 0
    private var requestsOnConnection = 0
    private var remainingDownload = 0
    private var chunkedDownload = false
    private var context: ChannelHandlerContext?

    init(upstream: TestUpstream) { self.upstream = upstream }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            bodyBytes = 0
            checksum = 0
            requestsOnConnection += 1
            upstream.arrived(h)
        case .body(let buffer):
            bodyBytes += buffer.readableBytes
            if head?.uri.contains("sum") == true {
                buffer.withUnsafeReadableBytes { raw in for b in raw { checksum = checksum &* 31 &+ UInt32(b) } }
            }
        case .end(let trailers):
            guard let head else { return }
            upstream.stats.withLockedValue {
                $0.lastTrailers = trailers
                $0.completed.append(head.uri)
            }
            if head.uri.hasPrefix("/ws") { return upgrade(context: context, head: head) }
            respond(context: context, head: head)
        }
    }

    private func query(_ head: HTTPRequestHead, _ key: String) -> String? {
        guard let q = head.uri.split(separator: "?", maxSplits: 1).dropFirst().first else { return nil }
        for pair in q.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1)
            if kv.first.map(String.init) == key { return kv.count > 1 ? String(kv[1]) : "" }
        }
        return nil
    }

    private func send(context: ChannelHandlerContext, status: HTTPResponseStatus = .ok, _ text: String, extra: [(String, String)] = []) {
        var headers = HTTPHeaders([("content-length", String(text.utf8.count)), ("content-type", "text/plain")])
        for (n, v) in extra { headers.add(name: n, value: v) }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: text)))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    private func respond(context: ChannelHandlerContext, head: HTTPRequestHead) {
        let path = String(head.uri.split(separator: "?").first ?? "")
        switch path {
        case "/upload":
            send(context: context, "n=\(bodyBytes) sum=\(checksum)")
        case "/download":
            remainingDownload = Int(query(head, "n") ?? "0") ?? 0
            chunkedDownload = query(head, "chunked") != nil
            var headers = HTTPHeaders()
            if !chunkedDownload { headers.add(name: "content-length", value: String(remainingDownload)) }
            else { headers.add(name: "transfer-encoding", value: "chunked") }
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            pumpDownload(context: context)
        case "/slow":
            let ms = Int64(query(head, "ms") ?? "100") ?? 100
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: .milliseconds(ms)) {
                let (handler, ctx) = bound.value
                handler.send(context: ctx, "slow done")
            }
        case "/hold":
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let loop = context.eventLoop
            upstream.held.withLockedValue {
                $0.append { loop.execute { bound.value.0.send(context: bound.value.1, "released") } }
            }
        case "/hang":
            break
        case "/reset":
            var headers = HTTPHeaders()
            headers.add(name: "content-length", value: "1000")
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "0123456789")))), promise: nil)
            context.close(promise: nil)
        case "/stall":
            var headers = HTTPHeaders()
            headers.add(name: "content-length", value: "1000")
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "0123456789")))), promise: nil)
        case "/switch":
            context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .switchingProtocols, headers: ["Upgrade": "x", "Connection": "Upgrade"]))), promise: nil)
        case "/continue":
            context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .continue))), promise: nil)
            send(context: context, "after interim")
        case "/flaky":
            if requestsOnConnection > 1 { context.close(promise: nil) } else { send(context: context, "flaky ok") }
        case "/setcookie":
            // An app trying to set the gateway's own cookies, next to its own.
            send(context: context, "cookies", extra: [
                ("set-cookie", "__Host-sessiongate=chosen-by-app; Path=/; Secure"), ("set-cookie", "theme=dark; Path=/"),
                ("set-cookie", "__Host-sessiongate-login=x; Path=/"),
            ])
        case "/close":
            send(context: context, "closing", extra: [("connection", "close")])
            context.close(promise: nil)
        default:
            var text = "\(head.method.rawValue) \(head.uri) HTTP/\(head.version.major).\(head.version.minor)\n"
            for (name, value) in head.headers { text += "\(name): \(value)\n" }
            text += "body-bytes: \(bodyBytes)\n"
            send(context: context, text)
        }
    }

    private func pumpDownload(context: ChannelHandlerContext) {
        let chunk = 64 * 1024
        while remainingDownload > 0, context.channel.isWritable {
            let n = min(chunk, remainingDownload)
            remainingDownload -= n
            var buffer = context.channel.allocator.buffer(capacity: n)
            buffer.writeRepeatingByte(UInt8(ascii: "x"), count: n)
            context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        }
        if remainingDownload == 0 {
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            remainingDownload = -1
        } else {
            context.flush()
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, remainingDownload > 0 { pumpDownload(context: context) }
        context.fireChannelWritabilityChanged()
    }

    private func upgrade(context: ChannelHandlerContext, head: HTTPRequestHead) {
        guard head.headers["upgrade"].first?.lowercased() == "websocket" else { return }
        let headers = HTTPHeaders([("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Accept", "test"),
                                   ("Set-Cookie", "__Host-sessiongate=chosen-by-app; Path=/")])
        context.writeAndFlush(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .switchingProtocols, headers: headers))), promise: nil)
        let sync = context.pipeline.syncOperations
        do {
            try sync.addHandler(EchoHandler())
            _ = sync.removeHandler(try sync.handler(type: HTTPResponseEncoder.self))
            _ = sync.removeHandler(try sync.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self))
            _ = sync.removeHandler(context: context)
        } catch {
            context.close(promise: nil)
        }
    }
}

final class EchoHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.writeAndFlush(data, promise: nil)
    }
}
