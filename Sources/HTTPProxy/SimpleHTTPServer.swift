import NIOCore
import NIOHTTP1
import NIOPosix

/// A request as the gateway's small built-in servers (admin listener, demo upstream) see it.
public struct SimpleRequest: Sendable {
    public var head: HTTPRequestHead
    public var body: ByteBuffer
    public var remoteAddress: SocketAddress?
}

public struct SimpleResponse: Sendable {
    public var status: HTTPResponseStatus
    public var contentType: String
    public var body: ByteBuffer
    /// Further headers (e.g. `Location`); framing and `cache-control: no-store` are added.
    public var headers: [(String, String)]
    /// Hold the response this long before sending it (the simulator's latency fault).
    public var delay: TimeAmount = .zero

    public init(status: HTTPResponseStatus = .ok, contentType: String = "text/plain; charset=utf-8", body: ByteBuffer, headers: [(String, String)] = []) {
        self.status = status
        self.contentType = contentType
        self.body = body
        self.headers = headers
    }

    public init(status: HTTPResponseStatus = .ok, contentType: String = "text/plain; charset=utf-8", _ text: String, headers: [(String, String)] = []) {
        self.init(status: status, contentType: contentType, body: ByteBuffer(string: text), headers: headers)
    }
}

/// A minimal buffered HTTP/1.1 server for low-traffic endpoints (never the data path).
/// Request bodies above 64 KiB are refused.
public final class SimpleHTTPServer: Sendable {
    public typealias Responder = @Sendable (SimpleRequest) -> SimpleResponse
    /// A responder whose answer may come later (work that must not run on the event loop). A
    /// connection answered later is closed after the answer: requests pipelined behind it are
    /// not read.
    public typealias LaterResponder = @Sendable (SimpleRequest, any EventLoop) -> EventLoopFuture<SimpleResponse>
    private let channel: any Channel

    public var localAddress: SocketAddress? { channel.localAddress }

    private init(channel: any Channel) { self.channel = channel }

    public static func start(host: String, port: Int, group: any EventLoopGroup, responder: @escaping Responder) async throws -> SimpleHTTPServer {
        try await start(host: host, port: port, group: group) { request, loop in loop.makeSucceededFuture(responder(request)) }
    }

    public static func start(host: String, port: Int, group: any EventLoopGroup, later responder: @escaping LaterResponder) async throws -> SimpleHTTPServer {
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(SimpleHTTPHandler(responder: responder))
                }
            }
            .bind(host: host, port: port)
            .get()
        return SimpleHTTPServer(channel: channel)
    }

    public func close() async {
        try? await channel.close()
    }
}

final class SimpleHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let responder: SimpleHTTPServer.LaterResponder
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()
    private var tooLarge = false
    /// An answer is awaited: what arrives meanwhile is not read, and the connection closes after it.
    private var waiting = false
    /// The awaited answer did not come at once.
    private var answeredLater = false

    init(responder: @escaping SimpleHTTPServer.LaterResponder) { self.responder = responder }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !waiting else { return }
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            body.clear()
            tooLarge = false
        case .body(var chunk):
            if body.readableBytes + chunk.readableBytes > 65536 { tooLarge = true } else { body.writeBuffer(&chunk) }
        case .end:
            guard let head else { return }
            self.head = nil
            let answer = tooLarge
                ? context.eventLoop.makeSucceededFuture(SimpleResponse(status: .payloadTooLarge, "413 request body too large\n"))
                : responder(SimpleRequest(head: head, body: body, remoteAddress: context.channel.remoteAddress), context.eventLoop)
            let keepAlive = head.isKeepAlive && !tooLarge
            // An answer already there is sent at once (the callback runs inline, on this loop).
            waiting = true
            answeredLater = false
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            answer.hop(to: context.eventLoop).whenComplete { result in
                let (handler, context) = bound.value
                handler.waiting = false
                let response = (try? result.get()) ?? SimpleResponse(status: .internalServerError, "500 the answer failed\n")
                handler.send(response, to: head, keepAlive: keepAlive && !handler.answeredLater, context: context)
            }
            if waiting { answeredLater = true }
        }
    }

    private func send(_ response: SimpleResponse, to head: HTTPRequestHead, keepAlive: Bool, context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: response.contentType)
        headers.add(name: "content-length", value: String(response.body.readableBytes))
        headers.add(name: "cache-control", value: "no-store")
        for (name, value) in response.headers { headers.add(name: name, value: value) }
        if !keepAlive { headers.add(name: "connection", value: "close") }
        let send = { (context: ChannelHandlerContext) in
            context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: response.status, headers: headers))), promise: nil)
            if head.method != .HEAD { context.write(self.wrapOutboundOut(.body(.byteBuffer(response.body))), promise: nil) }
            let channel = context.channel
            context.writeAndFlush(self.wrapOutboundOut(.end(nil))).whenComplete { _ in
                if !keepAlive { channel.close(promise: nil) }
            }
        }
        if response.delay > .zero {
            let bound = NIOLoopBound((context, send), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: response.delay) { bound.value.1(bound.value.0) }
        } else {
            send(context)
        }
    }
}
