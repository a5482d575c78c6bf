import Logging
import NIOCore
import NIOHTTP2

/// Last on an HTTP/2 connection, after NIOHTTP2's handler: runs `HTTP2ConnectionLifecycle`
/// (GOAWAY when idle and on a drain), counts the connection as a client connection (as the
/// HTTP/1.1 handler does), and closes it on a connection error, which NIOHTTP2 has already
/// answered with GOAWAY.
final class HTTP2ConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    private let idle: TimeAmount
    private let observer: any ProxyObserver
    private let logger: Logger
    private var lifecycle = HTTP2ConnectionLifecycle()
    private var timer: Scheduled<Void>? = nil
    private var counted = false

    init(idle: TimeAmount, observer: any ProxyObserver, logger: Logger) {
        self.idle = idle
        self.observer = observer
        self.logger = logger
    }

    /// Added to an active channel (after ALPN or the h2c preface): the connection starts here.
    func handlerAdded(context: ChannelHandlerContext) {
        counted = true
        observer.clientConnectionOpened()
        run(lifecycle.started(), context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        run(lifecycle.closed(), context: context)
        if counted {
            counted = false
            observer.clientConnectionClosed()
        }
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case let created as NIOHTTP2StreamCreatedEvent: run(lifecycle.streamOpened(created.streamID), context: context)
        case is StreamClosedEvent: run(lifecycle.streamClosed(), context: context)
        case is ChannelShouldQuiesceEvent: run(lifecycle.quiesce(), context: context)
        default: break
        }
        context.fireUserInboundEventTriggered(event)
    }

    /// Connection-level frames (SETTINGS, PING, GOAWAY, WINDOW_UPDATE): NIOHTTP2 acted on them.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        logger.debug("http2 connection error", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    private func run(_ action: HTTP2ConnectionLifecycle.Action, context: ChannelHandlerContext) {
        switch action {
        case .none:
            break
        case .armIdleTimer:
            timer?.cancel()
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            timer = context.eventLoop.scheduleTask(in: idle) {
                let (handler, context) = bound.value
                handler.timer = nil
                handler.run(handler.lifecycle.idleTimerFired(), context: context)
            }
        case .cancelIdleTimer:
            timer?.cancel()
            timer = nil
        case .goAway(let lastStreamID):
            context.writeAndFlush(wrapOutboundOut(Self.goAway(lastStreamID)), promise: nil)
        case .goAwayAndClose(let lastStreamID):
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(Self.goAway(lastStreamID))).whenComplete { _ in channel.close(promise: nil) }
        case .close:
            context.close(promise: nil)
        }
    }

    private static func goAway(_ lastStreamID: HTTP2StreamID) -> HTTP2Frame {
        HTTP2Frame(streamID: .rootStream, payload: .goAway(lastStreamID: lastStreamID, errorCode: .noError, opaqueData: nil))
    }
}
