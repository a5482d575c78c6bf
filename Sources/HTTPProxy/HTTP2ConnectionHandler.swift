import Logging
import NIOCore
import NIOHTTP2

/// Last on an HTTP/2 connection, after NIOHTTP2's handler: runs `HTTP2ConnectionLifecycle`
/// (GOAWAY when idle and on a drain; streams are counted through `HTTP2StreamCounter`), counts
/// the connection as a client connection (as the HTTP/1.1 handler does), and logs the errors
/// NIOHTTP2 reports (a connection error's close is `HTTP2GoAwayWatcher`'s: an error here may be
/// one stream's).
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
    private var context: ChannelHandlerContext? = nil

    init(idle: TimeAmount, observer: any ProxyObserver, logger: Logger) {
        self.idle = idle
        self.observer = observer
        self.logger = logger
    }

    /// Added to an active channel (after ALPN or the h2c preface): the connection starts here.
    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        counted = true
        observer.clientConnectionOpened()
        run(lifecycle.started(), context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        self.context = nil
    }

    func streamOpened(_ id: HTTP2StreamID) {
        guard let context else { return }
        run(lifecycle.streamOpened(id), context: context)
    }

    func streamClosed() {
        guard let context else { return }
        run(lifecycle.streamClosed(), context: context)
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
        if event is ChannelShouldQuiesceEvent { run(lifecycle.quiesce(), context: context) }
        if case ChannelEvent.inputClosed = event { run(lifecycle.inputClosed(), context: context) }
        context.fireUserInboundEventTriggered(event)
    }

    /// Connection-level frames (SETTINGS, PING, GOAWAY, WINDOW_UPDATE): NIOHTTP2 acted on them.
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        logger.debug("http2 error", metadata: ["error": "\(error)"])
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
