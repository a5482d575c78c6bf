import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TestSupport

/// An upstream that answers every request head with fixed bytes, exactly as given: for
/// responses no well-behaved server library would produce (ambiguous framing, odd statuses).
final class RawUpstream: Sendable {
    let channel: any Channel
    var port: Int { channel.localAddress!.port! }

    /// Runs `body` with a started upstream, closed before this returns or rethrows.
    static func with<Result>(response: String, _ body: (RawUpstream) async throws -> Result) async throws -> Result {
        try await withTeardown(try await start(response: response), stop: { await $0.close() }, body)
    }

    private static func start(response: String) async throws -> RawUpstream {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Responder(response: response)) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return RawUpstream(channel: channel)
    }

    private init(channel: any Channel) { self.channel = channel }

    func close() async { try? await channel.close() }

    private final class Responder: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let response: String
        var received = ""
        init(response: String) { self.response = response }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received += String(buffer: unwrapInboundIn(data))
            guard received.contains("\r\n\r\n") else { return }
            received = ""
            let channel = context.channel
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: response))).whenComplete { _ in channel.close(promise: nil) }
        }
    }
}
