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
    private let channel: any Channel

    public var localAddress: SocketAddress? { channel.localAddress }

    private init(channel: any Channel) { self.channel = channel }

    public static func start(host: String, port: Int, group: any EventLoopGroup, responder: @escaping Responder) async throws -> SimpleHTTPServer {
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

    private let responder: SimpleHTTPServer.Responder
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()
    private var tooLarge = false

    init(responder: @escaping SimpleHTTPServer.Responder) { self.responder = responder }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
            body.clear()
            tooLarge = false
        case .body(var chunk):
            if body.readableBytes + chunk.readableBytes > 65536 { tooLarge = true } else { body.writeBuffer(&chunk) }
        case .end:
            guard let head else { return }
            let response = tooLarge
                ? SimpleResponse(status: .payloadTooLarge, "413 request body too large\n")
                : responder(SimpleRequest(head: head, body: body, remoteAddress: context.channel.remoteAddress))
            var headers = HTTPHeaders()
            headers.add(name: "content-type", value: response.contentType)
            headers.add(name: "content-length", value: String(response.body.readableBytes))
            headers.add(name: "cache-control", value: "no-store")
            for (name, value) in response.headers { headers.add(name: name, value: value) }
            let keepAlive = head.isKeepAlive && !tooLarge
            if !keepAlive { headers.add(name: "connection", value: "close") }
            self.head = nil
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
}
