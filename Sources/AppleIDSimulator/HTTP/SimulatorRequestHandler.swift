import NIOCore
import NIOHTTP1

/// Moves requests from NIO's HTTP/1 decoder to the responder and its answers back; what to do
/// with each part is `SimulatorRequestCollector`'s decision.
final class SimulatorRequestHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let responder: SimulatorHTTPServer.Responder
    private var collector = SimulatorRequestCollector()

    init(responder: @escaping SimulatorHTTPServer.Responder) { self.responder = responder }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch collector.receive(unwrapInboundIn(data)) {
        case .wait:
            return
        case .respond(let head, let body):
            let response = responder(SimulatorRequest(head: head, body: body, remoteAddress: context.channel.remoteAddress))
            answer(head, with: response, keepAlive: head.isKeepAlive, context: context)
        case .refuseTooLarge(let head):
            answer(head, with: SimulatorResponse(status: .payloadTooLarge, "413 request body too large\n"), keepAlive: false, context: context)
        }
    }

    private func answer(_ request: HTTPRequestHead, with response: SimulatorResponse, keepAlive: Bool, context: ChannelHandlerContext) {
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: response.contentType)
        headers.add(name: "content-length", value: String(response.body.readableBytes))
        headers.add(name: "cache-control", value: "no-store")
        for (name, value) in response.headers { headers.add(name: name, value: value) }
        if !keepAlive { headers.add(name: "connection", value: "close") }
        let head = HTTPResponseHead(version: request.version, status: response.status, headers: headers)
        let withBody = request.method != .HEAD
        let send: (ChannelHandlerContext) -> Void = { context in
            context.write(self.wrapOutboundOut(.head(head)), promise: nil)
            if withBody { context.write(self.wrapOutboundOut(.body(.byteBuffer(response.body))), promise: nil) }
            let channel = context.channel
            context.writeAndFlush(self.wrapOutboundOut(.end(nil))).whenComplete { _ in
                if !keepAlive { channel.close(promise: nil) }
            }
        }
        guard response.delay > .zero else { return send(context) }
        let bound = NIOLoopBound((context, send), eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: response.delay) { bound.value.1(bound.value.0) }
    }
}
