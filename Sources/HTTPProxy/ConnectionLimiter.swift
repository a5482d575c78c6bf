import NIOCore
import Synchronization

/// Why a client connection was refused at accept (bounded: a metric label).
public enum ConnectionRefusal: String, Sendable, CaseIterable {
    /// `server.limits.max_connections` reached.
    case instance
    /// `server.limits.max_connections_per_client` reached for the client's address.
    case client
}

/// Open client connections, counted per instance and per client address, against
/// `server.limits.max_connections` and `max_connections_per_client` (0: no cap). Shared by every
/// event loop of a listener; consulted once per accepted connection, never per request.
///
/// A connection from one of `server.trusted_proxies` carries many clients' requests (a
/// terminator's keep-alive pool): it counts against the instance, not against one client.
final class ConnectionLimiter: Sendable {
    private let maxTotal: Int
    private let maxPerClient: Int
    private let counts = Mutex<(total: Int, perClient: [String: Int])>((0, [:]))

    init(maxTotal: Int, maxPerClient: Int) {
        self.maxTotal = maxTotal
        self.maxPerClient = maxPerClient
    }

    /// Whether any cap is set (without one, nothing is counted).
    var isActive: Bool { maxTotal > 0 || maxPerClient > 0 }

    /// The decision for one more connection, given what is open (a pure rule, table-tested).
    static func refusal(total: Int, ofClient: Int?, maxTotal: Int, maxPerClient: Int) -> ConnectionRefusal? {
        if maxTotal > 0, total >= maxTotal { return .instance }
        if maxPerClient > 0, let ofClient, ofClient >= maxPerClient { return .client }
        return nil
    }

    /// Counts a new connection of `client` (nil: not counted per client), or says why not.
    func open(client: String?) -> ConnectionRefusal? {
        counts.withLock { counts in
            let ofClient = client.map { counts.perClient[$0] ?? 0 }
            if let refusal = Self.refusal(total: counts.total, ofClient: ofClient, maxTotal: maxTotal, maxPerClient: maxPerClient) {
                return refusal
            }
            counts.total += 1
            if let client, maxPerClient > 0 { counts.perClient[client, default: 0] += 1 }
            return nil
        }
    }

    /// A connection counted by `open(client:)` closed.
    func close(client: String?) {
        counts.withLock { counts in
            counts.total -= 1
            guard let client, maxPerClient > 0, let n = counts.perClient[client] else { return }
            counts.perClient[client] = n > 1 ? n - 1 : nil
        }
    }
}

/// A connection over a cap: answered `503` with `Retry-After` as soon as it is open, without
/// reading a request, then closed the lingering way (output shut, what the client still sends
/// discarded for a moment) so that the answer is not destroyed by a reset.
final class RefusedConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    static let body = "503 Service Unavailable: too many open connections\n"
    static let response = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n"
        + "connection: close\r\ncontent-length: \(body.utf8.count)\r\n\r\n" + body

    func channelActive(context: ChannelHandlerContext) {
        let channel = context.channel
        let lingerEnd = context.eventLoop.scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
        channel.closeFuture.whenComplete { _ in lingerEnd.cancel() }
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: Self.response))).whenComplete { result in
            guard case .success = result else { return channel.close(promise: nil) }
            channel.close(mode: .output, promise: nil)
        }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed { return context.close(promise: nil) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
}
