import NIOCore

/// A WebSocket handshake the app accepted (101) turns both connections into one byte tunnel:
/// the HTTP handlers leave both pipelines, a `GlueHandler` pair takes their place, and the bytes
/// each side sent behind its head (already read by the wire engine) are handed to the other.
enum Upgrade {
    /// Splices the client connection (whose proxy handler is `context`'s) to the upstream one.
    /// `clientBytes`: what the client sent behind its handshake. The upstream's early bytes went
    /// to the client with the 101. `clientInputClosed`: the client's FIN came before the tunnel
    /// (the glue will never see it), so it is passed on to the app now. On failure both
    /// connections close and the lease ends.
    static func splice(client context: ChannelHandlerContext, upstream connection: UpstreamConnection, upstreamChannel: any Channel,
                       clientBytes: ByteBuffer, clientInputClosed: Bool, tunnel: TunnelLease?) {
        connection.owner = nil
        // A tunnel's close must not drop what one side sent last (a WebSocket close frame).
        UpstreamConnection.setAbortiveClose(upstreamChannel, false)
        connection.pool?.tunnelled(connection)
        let (clientGlue, upstreamGlue) = GlueHandler.pair()
        do {
            let up = upstreamChannel.pipeline.syncOperations
            try up.addHandler(upstreamGlue)
            _ = up.removeHandler(connection)
            let down = context.pipeline.syncOperations
            try down.addHandler(clientGlue)
            let clientChannel = context.channel
            if clientBytes.readableBytes > 0 { upstreamChannel.writeAndFlush(clientBytes, promise: nil) }
            if clientInputClosed { upstreamChannel.close(mode: .output, promise: nil) }
            _ = down.removeHandler(context: context)
            // The proxy handler held back the client's read while the handshake was in flight:
            // the glue takes over reading on both sides from here.
            clientChannel.read()
            upstreamChannel.read()
            tunnel?.attach([clientChannel, upstreamChannel])
        } catch {
            tunnel?.finish()
            upstreamChannel.close(promise: nil)
            context.close(promise: nil)
        }
    }
}
