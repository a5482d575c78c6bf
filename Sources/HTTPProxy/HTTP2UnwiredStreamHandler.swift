import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2

/// The stream handler until the exchange core serves HTTP/2 streams (issue 26): it checks and
/// translates the request head as the exchange will (`HTTP2RequestHead`) — a malformed one is
/// reset with PROTOCOL_ERROR, one over the head bounds answered 431 — and answers every other
/// request, once its body has arrived, `503` "HTTP/2 exchange not wired yet". Nothing goes
/// upstream.
final class HTTP2UnwiredStreamHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame.FramePayload
    typealias OutboundOut = HTTP2Frame.FramePayload

    static let body = "HTTP/2 exchange not wired yet"

    /// The `HTTP2StreamInitializer` that installs it.
    static let initializer: HTTP2StreamInitializer = { stream, environment in
        try stream.pipeline.syncOperations.addHandler(HTTP2UnwiredStreamHandler(environment: environment))
    }

    private let maxHeadBytes: Int
    private let maxFields: Int
    private var answer: LocalResponse? = nil
    private var headRequest = false
    private var done = false

    init(environment: HTTP2StreamEnvironment) {
        let limits = environment.shared.limits
        self.maxHeadBytes = max(limits.maxHeaderBytes, environment.settings.maxHeaderListSize)
        self.maxFields = limits.maxHeaderCount
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        switch unwrapInboundIn(data) {
        case .headers(let headers) where answer == nil:
            switch HTTP2RequestHead.make(headers.headers, endStream: headers.endStream, maxHeadBytes: maxHeadBytes, maxFields: maxFields) {
            case .success(let request):
                headRequest = request.head.method == .HEAD
                answer = .error(.serviceUnavailable, Self.body)
            case .failure(let refusal) where refusal.isStreamError:
                done = true
                context.writeAndFlush(wrapOutboundOut(.rstStream(refusal.errorCode)), promise: nil)
                return
            case .failure:
                answer = .error(.requestHeaderFieldsTooLarge, "request header fields too large")
            }
            if headers.endStream { respond(context) }
        case .headers(let trailers):
            if trailers.endStream { respond(context) }
        case .data(let data):
            if data.endStream { respond(context) }
        default:
            break
        }
    }

    private func respond(_ context: ChannelHandlerContext) {
        guard let answer, !done else { return }
        done = true
        let (headers, body) = HTTP2ResponseHeaders.local(answer, requestID: nil, headRequest: headRequest)
        context.write(wrapOutboundOut(.headers(.init(headers: headers, endStream: body == nil))), promise: nil)
        if let body { context.write(wrapOutboundOut(.data(.init(data: .byteBuffer(body), endStream: true))), promise: nil) }
        context.flush()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A stream error NIOHTTP2 found (and answered with RST_STREAM): the stream is over.
        context.close(promise: nil)
    }
}
