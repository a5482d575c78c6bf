import NIOCore
import NIOHTTP1

/// Receives what one upstream connection delivers while it serves an exchange.
protocol UpstreamConnectionOwner: AnyObject {
    func upstreamRead(_ part: ResponseReader.Part)
    func upstreamReadComplete()
    func upstreamClosed(_ error: (any Error)?)
    func upstreamWritabilityChanged(isWritable: Bool)
    /// The client can take more response bytes.
    var clientIsWritable: Bool { get }
}

/// One keep-alive connection to an upstream, owned by its event loop's pool while idle and by
/// one client exchange while busy, serving one principal (`UpstreamPrincipal`) for its whole
/// life. Reads are gated on the client's writability (back-pressure from client to upstream).
/// An idle connection that receives a byte closes: it belongs to no request.
///
/// It speaks HTTP/1.1 itself, with the wire engine: responses are read by a `ResponseReader`
/// straight from the received bytes, and requests are written as bytes (`writeHead`,
/// `writeBody`, `writeEnd`) — no NIO codec in this pipeline.
final class UpstreamConnection: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let address: UpstreamAddress
    /// Whose requests it carries; nil: one request only.
    let principal: UpstreamPrincipal?
    private(set) var context: ChannelHandlerContext?
    private var readPending = false
    private(set) var isActive = true
    /// Served at least one exchange before (a reused connection may have been closed by the
    /// upstream in the meantime: the retry rule depends on it).
    var reused = false
    /// Where it stands in its pool's budget (`UpstreamPool`).
    enum PoolState: Equatable {
        case connecting, inUse
        /// Kept idle since then, with the pool's stamp of that release.
        case idle(since: NIODeadline, stamp: UInt64)
        /// Out of the budget (closed, or a tunnel's).
        case gone
    }
    var poolState = PoolState.connecting
    /// Its upstream's bookkeeping in its pool, once the pool counts it (nil: a connection no
    /// pool knows of, or a tunnel's).
    var poolUpstream: UpstreamPool.Upstream? = nil
    var pool: UpstreamPool? { poolUpstream?.pool }
    var idleSince: NIODeadline? {
        if case .idle(let since, _) = poolState { return since }
        return nil
    }
    /// Still idle since the release that gave it `stamp`.
    func isIdle(stamp: UInt64) -> Bool {
        if case .idle(_, let current) = poolState { return current == stamp }
        return false
    }
    /// False once what the app sent left the connection's framing in doubt (bytes behind a
    /// complete response, a bodyless response announcing a body): it serves no further request.
    var reusable: Bool { !bytesBehindResponse && !reader.framingInDoubt }
    private var bytesBehindResponse = false
    var owner: (any UpstreamConnectionOwner)? {
        didSet { if owner != nil, readPending { readPending = false; context?.read() } }
    }

    private var reader = ResponseReader()
    /// The request being written has a chunked body (its head says `Transfer-Encoding: chunked`).
    private var chunkedRequest = false

    init(address: UpstreamAddress, principal: UpstreamPrincipal? = nil) {
        self.address = address
        self.principal = principal
    }

    var channel: (any Channel)? { context?.channel }
    var isWritable: Bool { context?.channel.isWritable ?? false }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard owner != nil else {
            // Nothing is in flight: an idle connection must not speak. Drop it.
            return context.close(promise: nil)
        }
        reader.receive(unwrapInboundIn(data))
        do {
            while let owner, let part = try reader.next() {
                // Bytes behind a complete response belong to no request: never reuse this
                // connection (the pool closes it when the exchange gives it back).
                if case .end = part, reader.hasUnreadBytes { bytesBehindResponse = true }
                owner.upstreamRead(part)
            }
        } catch {
            fail(context: context, error)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) { owner?.upstreamReadComplete() }

    func channelInactive(context: ChannelHandlerContext) {
        isActive = false
        pool?.closed(self)
        // A body read until close ends here; any other body or head was cut short. A body cut
        // short is the connection's failure (reset during the response), a head cut short is
        // not a response.
        if let owner {
            let inBody = reader.readingBody
            do {
                if let part = try reader.finish() { owner.upstreamRead(part) }
            } catch {
                if !inBody { return fail(context: context, error) }
            }
        }
        let owner = self.owner
        self.owner = nil
        owner?.upstreamClosed(nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context: context, error)
    }

    /// The connection is unusable (a transport error, or bytes that are not a response): the
    /// owner learns why, and it closes.
    private func fail(context: ChannelHandlerContext, _ error: any Error) {
        isActive = false
        pool?.closed(self)
        let owner = self.owner
        self.owner = nil
        owner?.upstreamClosed(error)
        context.close(promise: nil)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        owner?.upstreamWritabilityChanged(isWritable: context.channel.isWritable)
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if let owner, !owner.clientIsWritable {
            readPending = true
        } else {
            context.read()
        }
    }

    /// The client drained: resume reading if a read was held back.
    func clientBecameWritable() {
        if readPending {
            readPending = false
            context?.read()
        }
    }

    /// Writes a request head (`UpstreamRequestHead`'s bytes); `chunked`: its body follows in
    /// chunks (the head says so).
    func writeHead(_ head: ByteBuffer, method: HTTPMethod, chunked: Bool) {
        guard let context else { return }
        chunkedRequest = chunked
        reader.expectResponse(to: method)
        context.write(wrapOutboundOut(head), promise: nil)
    }

    func writeBody(_ bytes: ByteBuffer) {
        guard let context, bytes.readableBytes > 0 else { return }
        guard chunkedRequest else { return context.write(wrapOutboundOut(bytes), promise: nil) }
        HTTPWire.writeChunk(bytes, context: context)
    }

    /// The request is complete. Request trailers are never sent: servers that merge them into
    /// the headers would see fields (an identity header) the rules never checked.
    func writeEnd() {
        guard let context, chunkedRequest else { return }
        context.write(wrapOutboundOut(ByteBuffer(staticString: "0\r\n\r\n")), promise: nil)
    }

    /// After a 101: the bytes that came behind the response head, the tunnel's first.
    func takeTunnelBytes() -> ByteBuffer { reader.takeRemaining() }

    func flush() { context?.flush() }

    func close() {
        isActive = false
        owner = nil
        context?.close(promise: nil)
    }

    /// Whether closing `channel` resets it (`SO_LINGER` 0: no `TIME_WAIT`, unsent bytes dropped)
    /// rather than ending it with a FIN.
    static func setAbortiveClose(_ channel: any Channel, _ abortive: Bool) {
        _ = (channel as? any SocketOptionProvider)?.setSoLinger(NIOLinger(l_onoff: abortive ? 1 : 0, l_linger: 0))
    }
}
