import NIOCore
import NIOHTTP1
import NIOPosix

/// The simulator's own small HTTP/1.1 server on NIO's decoder and encoder: buffered requests,
/// one answer each. It shares no code with the gateway (it must not import `HTTPProxy`): an
/// independent stand-in for appleid.apple.com checks the gateway's HTTP rather than agreeing
/// with it.
final class SimulatorHTTPServer: Sendable {
    typealias Responder = @Sendable (SimulatorRequest) -> SimulatorResponse

    private let channel: any Channel

    /// Where it listens (the port chosen when started on port 0).
    var localAddress: SocketAddress? { channel.localAddress }

    private init(channel: any Channel) { self.channel = channel }

    /// Binds `host:port` (0: a free port) and answers every request with `responder`.
    static func start(host: String, port: Int, group: any EventLoopGroup, responder: @escaping Responder) async throws -> SimulatorHTTPServer {
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(SimulatorRequestHandler(responder: responder))
                }
            }
            .bind(host: host, port: port)
            .get()
        return SimulatorHTTPServer(channel: channel)
    }

    /// Stops listening; connections already open finish on their own.
    func close() async {
        try? await channel.close()
    }
}
