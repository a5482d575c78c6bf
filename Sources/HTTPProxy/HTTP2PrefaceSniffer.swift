import NIOCore

/// First on a plain listener with `server.http2_cleartext`: tells HTTP/2 with prior knowledge
/// from HTTP/1.1 by the first bytes, then hands the connection to the pipeline of the protocol
/// and leaves. A connection whose first 24 bytes are the HTTP/2 connection preface (RFC 9113
/// §3.4) is HTTP/2; one that differs from it at any byte is HTTP/1.1, decided at that byte (an
/// HTTP/1.1 request never waits for 24 bytes: no method starts with `PRI `).
///
/// Until it decides it holds what it read (at most 23 bytes); a client that sends part of the
/// preface and stops is closed after `timeout`, and one that ends its input is handed to
/// HTTP/1.1 with what it sent.
final class HTTP2PrefaceSniffer: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    enum Choice: Equatable {
        case http1
        case http2
    }

    /// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
    static let preface: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    /// Adds the pipeline of the protocol chosen (at the end of the pipeline, which is right
    /// after this handler).
    private let configure: (Choice, ChannelPipeline.SynchronousOperations) throws -> Void
    private let timeout: TimeAmount
    private var received = ByteBuffer()
    private var timer: Scheduled<Void>? = nil
    private var decided = false

    init(timeout: TimeAmount, configure: @escaping (Choice, ChannelPipeline.SynchronousOperations) throws -> Void) {
        self.timeout = timeout
        self.configure = configure
    }

    /// What the bytes so far say: a choice, or nil while they are a strict prefix of the preface.
    static func choice(_ bytes: ByteBuffer) -> Choice? {
        let count = min(bytes.readableBytes, preface.count)
        let matches = bytes.withUnsafeReadableBytes { raw in
            (0..<count).allSatisfy { raw[$0] == preface[$0] }
        }
        if !matches { return .http1 }
        return count == preface.count ? .http2 : nil
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: timeout) { bound.value.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !decided else { return context.fireChannelRead(data) }
        var bytes = unwrapInboundIn(data)
        received.writeBuffer(&bytes)
        guard let choice = Self.choice(received) else { return }
        if decide(choice, context: context) { context.pipeline.syncOperations.removeHandler(context: context, promise: nil) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard !decided, let closed = event as? ChannelEvent, closed == .inputClosed else { return context.fireUserInboundEventTriggered(event) }
        // The client said all it will: HTTP/1.1 answers whatever that was, then sees the end.
        let handedOver = decide(.http1, context: context)
        context.fireUserInboundEventTriggered(event)
        if handedOver { context.pipeline.syncOperations.removeHandler(context: context, promise: nil) }
    }

    /// Adds the chosen pipeline and hands it what was read; false when that failed (the
    /// connection is closed).
    private func decide(_ choice: Choice, context: ChannelHandlerContext) -> Bool {
        decided = true
        timer?.cancel()
        timer = nil
        do {
            try configure(choice, context.pipeline.syncOperations)
        } catch {
            context.close(promise: nil)
            return false
        }
        if received.readableBytes > 0 {
            context.fireChannelRead(NIOAny(received))
            context.fireChannelReadComplete()
        }
        received = ByteBuffer()
        return true
    }
}
