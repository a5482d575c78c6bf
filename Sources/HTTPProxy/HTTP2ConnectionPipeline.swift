import Logging
import NIOCore
import NIOHTTP2

/// What the handler of one HTTP/2 stream is given: the server's shared state, the connection's
/// upstream pool (its event loop's), and the HTTP/2 bounds.
struct HTTP2StreamEnvironment {
    let shared: ProxyShared
    let connector: any UpstreamConnector
    let settings: HTTP2Settings
    /// The connection's client (every stream's).
    let client: HTTP2Client
    /// The connection's `X-Request-Id`s for requests that come without one.
    let ids: HTTP2RequestIDs

    func requestID() -> String { ids.next() }
    func nextID() -> UInt64 { ids.nextValue() }
}

/// The request ids of one HTTP/2 connection, shared by its streams (all on its event loop).
final class HTTP2RequestIDs {
    private var ids: RequestIDs

    init(seed: UInt64) { ids = RequestIDs(seed: seed) }

    func next() -> String { ids.next() }
    func nextValue() -> UInt64 { ids.nextValue() }
}

/// Installs the handler of one HTTP/2 stream on its stream channel (inbound and outbound
/// `HTTP2Frame.FramePayload`), on the connection's event loop. Everything NIOHTTP2 refuses —
/// malformed header blocks, a `content-length` the DATA frames do not match, streams over the
/// concurrency limit, and every connection-level abuse — is refused before a stream handler
/// exists or sees the frame.
typealias HTTP2StreamInitializer = @Sendable (_ stream: any Channel, _ environment: HTTP2StreamEnvironment) throws -> Void

/// The pipeline of one HTTP/2 connection: `HTTP2GoAwayWatcher` (closes the connection once
/// NIOHTTP2 has answered a connection error with GOAWAY), NIOHTTP2's handler with its inline
/// stream multiplexer, bounded by `HTTP2Settings`, then `HTTP2ConnectionHandler` (idle and drain
/// GOAWAY, the connection count).
enum HTTP2ConnectionPipeline {
    /// NIOHTTP2's configuration for the bounds (each one of issue 26's resource-exhaustion
    /// classes).
    static func configuration(_ settings: HTTP2Settings) -> NIOHTTP2Handler.Configuration {
        var connection = NIOHTTP2Handler.ConnectionConfiguration()
        connection.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: settings.maxConcurrentStreams),
            HTTP2Setting(parameter: .maxHeaderListSize, value: settings.maxHeaderListSize),
            // RFC 8441's extended CONNECT is not offered.
            HTTP2Setting(parameter: .enableConnectProtocol, value: 0),
        ]
        // RFC 9113 §8.2 and §8.1.1: malformed header blocks and bodies that do not match their
        // content-length are stream errors (both on by default; said here because the proxy
        // relies on them).
        connection.headerBlockValidation = .enabled
        connection.contentLengthValidation = .enabled
        connection.maximumSequentialContinuationFrames = settings.maxSequentialContinuationFrames
        connection.maximumBufferedControlFrames = settings.maxBufferedControlFrames
        connection.controlFrameRateLimit.maximumCount = settings.maxControlFrames
        connection.controlFrameRateLimit.windowLength = settings.streamResetWindow
        var stream = NIOHTTP2Handler.StreamConfiguration()
        stream.streamResetFrameRateLimit.maximumCount = settings.maxStreamResets
        stream.streamResetFrameRateLimit.windowLength = settings.streamResetWindow
        stream.streamErrorRateLimit.maximumCount = settings.maxStreamErrors
        stream.streamErrorRateLimit.windowLength = settings.streamResetWindow
        return NIOHTTP2Handler.Configuration(connection: connection, stream: stream)
    }

    /// Adds the HTTP/2 handlers at the end of `channel`'s pipeline (already active: after ALPN
    /// chose h2, or after the h2c preface was seen). On the channel's event loop.
    static func configure(_ channel: any Channel, environment: HTTP2StreamEnvironment, idle: TimeAmount, logger: Logger,
                          streams: @escaping HTTP2StreamInitializer) throws {
        let sync = channel.pipeline.syncOperations
        let configuration = configuration(environment.settings)
        let bound = NIOLoopBound(environment, eventLoop: channel.eventLoop)
        let connection = HTTP2ConnectionHandler(idle: idle, observer: environment.shared.observer, logger: logger)
        try sync.addHandler(HTTP2GoAwayWatcher())
        _ = try sync.configureHTTP2Pipeline(
            mode: .server, connectionConfiguration: configuration.connection, streamConfiguration: configuration.stream,
            streamDelegate: HTTP2StreamCounter(NIOLoopBound(connection, eventLoop: channel.eventLoop))
        ) { stream in
            stream.eventLoop.makeCompletedFuture { try streams(stream, bound.value) }
        }
        try sync.addHandler(connection)
    }
}

/// Tells the connection handler of the streams NIOHTTP2's inline multiplexer opens and closes
/// (it reports them to a delegate, not down the connection's pipeline).
struct HTTP2StreamCounter: NIOHTTP2StreamDelegate {
    let handler: NIOLoopBound<HTTP2ConnectionHandler>

    init(_ handler: NIOLoopBound<HTTP2ConnectionHandler>) { self.handler = handler }

    func streamCreated(_ id: HTTP2StreamID, channel: any Channel) { handler.value.streamOpened(id) }
    func streamClosed(_ id: HTTP2StreamID, channel: any Channel) { handler.value.streamClosed() }
}
