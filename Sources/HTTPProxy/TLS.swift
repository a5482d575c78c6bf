import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOSSL
import NIOTLS

/// TLS termination on the public listener: the context new connections get (swapped when the
/// certificate is re-read on reload; connections already open keep theirs) and how long a
/// handshake may take.
public final class TLSTermination: Sendable {
    private let current: NIOLockedValueBox<NIOSSLContext>
    public let handshakeTimeout: TimeAmount

    public init(context: NIOSSLContext, handshakeTimeout: TimeAmount) {
        self.current = NIOLockedValueBox(context)
        self.handshakeTimeout = handshakeTimeout
    }

    /// New connections use `context` from now on.
    public func replace(_ context: NIOSSLContext) { current.withLockedValue { $0 = context } }

    var context: NIOSSLContext { current.withLockedValue { $0 } }

    /// The handlers in front of the HTTP decoder of one accepted connection.
    func addHandlers(to pipeline: ChannelPipeline.SynchronousOperations, observer: any ProxyObserver, logger: Logger) throws {
        try pipeline.addHandler(TLSRecordSniffer(observer: observer, logger: logger))
        try pipeline.addHandler(NIOSSLServerHandler(context: context))
        try pipeline.addHandler(TLSHandshakeGuard(timeout: handshakeTimeout, observer: observer, logger: logger))
    }
}

/// Why a client's TLS handshake did not complete (the `reason` label of
/// `sessiongate_tls_handshake_failures_total`).
public enum TLSHandshakeFailure: String, Sendable, CaseIterable {
    /// Not finished within `server.timeouts.tls_handshake`.
    case timeout
    /// Plain HTTP sent to the TLS port (answered with a plain 400, as nginx does).
    case plaintext
    /// Bytes that are neither TLS nor HTTP.
    case notTLS = "not_tls"
    /// The TLS library refused the handshake: no common version or cipher, a malformed record,
    /// or the client rejected the certificate (an alert).
    case handshake
    /// The client closed the connection before the handshake finished.
    case closed
}

/// First on a TLS connection: a TLS connection starts with a handshake record (0x16). Anything
/// else never reaches the TLS library or the app: plain HTTP gets a plain-text 400 that says
/// to use https, other bytes a close.
final class TLSRecordSniffer: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let observer: any ProxyObserver
    private let logger: Logger
    private var rejected = false

    init(observer: any ProxyObserver, logger: Logger) {
        self.observer = observer
        self.logger = logger
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !rejected else { return }
        let bytes = unwrapInboundIn(data)
        guard let first = bytes.getInteger(at: bytes.readerIndex, as: UInt8.self) else { return }
        if first == 0x16 {
            context.fireChannelRead(data)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            return
        }
        rejected = true
        let looksLikeHTTP = (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(first)
        observer.tlsHandshakeFailed(looksLikeHTTP ? .plaintext : .notTLS)
        logger.debug("tls: not a TLS client", metadata: ["reason": "\(looksLikeHTTP ? "plaintext" : "not_tls")"])
        guard looksLikeHTTP else { return context.close(promise: nil) }
        let body = "This port speaks HTTPS: use an https:// URL.\n"
        let response = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: \(body.utf8.count)\r\nconnection: close\r\n\r\n\(body)"
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(string: response))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }
}

/// Right after the TLS handler until the handshake is done: bounds it in time and turns its
/// failures into a count and a debug line, so that nothing of a failed handshake reaches the
/// HTTP handler (or the app). Removes itself once the handshake completes.
final class TLSHandshakeGuard: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    private let timeout: TimeAmount
    private let observer: any ProxyObserver
    private let logger: Logger
    private var timer: Scheduled<Void>? = nil
    private var failed = false

    init(timeout: TimeAmount, observer: any ProxyObserver, logger: Logger) {
        self.timeout = timeout
        self.observer = observer
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: timeout) {
            let (handler, context) = bound.value
            handler.fail(.timeout, context: context, detail: "no handshake within \(handler.timeout.nanoseconds / 1_000_000) ms")
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event {
            timer?.cancel()
            timer = nil
            context.fireUserInboundEventTriggered(event)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(.handshake, context: context, detail: "\(error)")
    }

    func channelInactive(context: ChannelHandlerContext) {
        // The sniffer already counted a connection it refused (nothing reached this handler).
        if !failed, timer != nil { fail(.closed, context: context, detail: "closed by the client") }
        context.fireChannelInactive()
    }

    private func fail(_ reason: TLSHandshakeFailure, context: ChannelHandlerContext, detail: String) {
        guard !failed else { return }
        failed = true
        timer?.cancel()
        timer = nil
        if reason != .closed || sawBytes(context) {
            observer.tlsHandshakeFailed(reason)
            logger.debug("tls handshake failed", metadata: ["reason": "\(reason.rawValue)", "detail": "\(detail)"])
        }
        context.close(promise: nil)
    }

    /// A connection closed before sending a byte (a TCP health check) is not a failed handshake.
    private func sawBytes(_ context: ChannelHandlerContext) -> Bool {
        (try? context.pipeline.syncOperations.handler(type: TLSRecordSniffer.self)) == nil
    }
}

/// An https upstream: the client context its connections use and the name its certificate must
/// carry. Pooled connections are keyed by identity: a reload that re-reads a CA makes new ones.
public final class UpstreamTLS: Sendable, Hashable {
    let context: NIOSSLContext
    /// SNI and the verified name; nil for an IP address (verified against the address itself).
    let serverName: String?

    public init(context: NIOSSLContext, serverName: String?) {
        self.context = context
        self.serverName = serverName
    }

    public static func == (a: UpstreamTLS, b: UpstreamTLS) -> Bool { a === b }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// The TLS handshake with an upstream failed (untrusted certificate, wrong name, no common
/// protocol) or did not finish in time.
struct UpstreamTLSFailure: Error, CustomStringConvertible {
    let detail: String
    var description: String { "upstream TLS handshake failed: \(detail)" }
}

/// Completes `promise` when the client handshake with an upstream is done, then leaves.
final class UpstreamHandshakeWaiter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    private let promise: EventLoopPromise<Void>
    private var done = false

    init(promise: EventLoopPromise<Void>) { self.promise = promise }

    var finished: EventLoopFuture<Void> { promise.futureResult }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event {
            complete(.success(()))
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        complete(.failure(UpstreamTLSFailure(detail: "\(error)")))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        complete(.failure(UpstreamTLSFailure(detail: "the upstream closed the connection during the handshake")))
        context.fireChannelInactive()
    }

    /// Also the handshake deadline's way to end the wait.
    func complete(_ result: Result<Void, any Error>) {
        guard !done else { return }
        done = true
        promise.completeWith(result)
    }
}
