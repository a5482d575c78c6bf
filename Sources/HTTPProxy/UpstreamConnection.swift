import NIOCore
import NIOHTTP1

/// Receives what one upstream connection delivers while it serves an exchange.
protocol UpstreamConnectionOwner: AnyObject {
    func upstreamRead(_ part: HTTPClientResponsePart)
    func upstreamReadComplete()
    func upstreamClosed(_ error: (any Error)?)
    func upstreamWritabilityChanged(isWritable: Bool)
    /// The client can take more response bytes.
    var clientIsWritable: Bool { get }
}

/// One keep-alive connection to an upstream, owned by its event loop's pool while idle and by
/// one client exchange while busy. Reads are gated on the client's writability (back-pressure
/// from client to upstream).
final class UpstreamConnection: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    let address: UpstreamAddress
    private(set) var context: ChannelHandlerContext?
    private var readPending = false
    private(set) var isActive = true
    /// Served at least one exchange before (a reused connection may have been closed by the
    /// upstream in the meantime: the retry rule depends on it).
    var reused = false
    /// Set while idle in the pool.
    var idleSince: NIODeadline? = nil
    weak var pool: UpstreamPool?
    var owner: (any UpstreamConnectionOwner)? {
        didSet { if owner != nil, readPending { readPending = false; context?.read() } }
    }

    init(address: UpstreamAddress) {
        self.address = address
    }

    var channel: (any Channel)? { context?.channel }
    var isWritable: Bool { context?.channel.isWritable ?? false }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        if let owner {
            owner.upstreamRead(part)
        } else {
            // Nothing is in flight: an idle connection must not speak. Drop it.
            context.close(promise: nil)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) { owner?.upstreamReadComplete() }

    func channelInactive(context: ChannelHandlerContext) {
        isActive = false
        pool?.remove(self)
        let owner = self.owner
        self.owner = nil
        owner?.upstreamClosed(nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        isActive = false
        pool?.remove(self)
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

    func write(_ part: HTTPClientRequestPart) {
        context?.write(wrapOutboundOut(part), promise: nil)
    }

    func flush() { context?.flush() }

    func close() {
        isActive = false
        owner = nil
        context?.close(promise: nil)
    }
}
