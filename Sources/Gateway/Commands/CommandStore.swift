import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Sessions

/// The configured Redis store, opened for a one-off command (`migrate`, `check --transfer`)
/// without a running gateway: what the CLI needs of it, so that the CLI itself knows nothing of
/// the store's types (README "Development": the import graph). Reached as the gateway reaches
/// it, through `GatewayStore`: every operation answered within `store.timeout` (5 s at least)
/// or failed, and timed under its `StoreOperation`.
public struct CommandStore: Sendable {
    let backend: RedisSessionBackend
    let store: GatewayStore

    /// Opens `configuration`'s Redis store; a start-up failure names its key.
    public static func open(_ configuration: GatewayConfiguration, logger: Logger) throws -> CommandStore {
        guard let endpoint = try StoreConnection.endpoint(configuration.store, commandTimeout: .seconds(5)) else {
            throw StartupFailure(key: "store.redis_url", "not set: this command works on the Redis store")
        }
        let backend = try StoreConnection.backend(endpoint, configuration.store, group: .singleton, logger: logger)
        // A command's operations chain several round trips (a transfer's arrival: a claim, the
        // profile, the link, a revocation): bounded as the gateway's, but never tighter than the
        // Redis client's own 5 s, which a store.timeout tuned for the hot path would be.
        let timeout = max(TimeAmount(configuration.store.timeout), .seconds(5))
        return CommandStore(backend: backend, store: GatewayStore(backend.store, timeout: timeout, metrics: GatewayMetrics()))
    }

    public func shutdown() async { await backend.shutdown() }

    /// `Migration.with` on this store, publishing what a migration tells the fleet (a user's
    /// sessions ended) on the store's channel, as a running gateway does.
    public func migration<T>(configuration: GatewayConfiguration, clientID: String?, perSecond: Double, logger: Logger,
                             transferred: @escaping @Sendable (TransferredUser) async -> Void, _ body: (Migration) async throws -> T) async throws -> T {
        let backend = self.backend
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        return try await Migration.with(configuration: configuration, store: store, clientID: clientID, perSecond: perSecond, logger: logger,
                                        publish: { message in try? await backend.publish(message, on: loop).get() }, transferred: transferred, body)
    }

    /// The transfer checklist (`check --transfer`) with what this store holds of the transfer.
    public func transferChecklist(_ configuration: GatewayConfiguration) async -> [String] {
        await TransferChecklist.lines(configuration, store: .success(store))
    }
}
