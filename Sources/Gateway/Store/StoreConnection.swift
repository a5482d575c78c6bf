import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Sessions

/// The session store's Redis, as the configuration describes it: for the gateway and for the
/// `sessions` command alike.
public enum StoreConnection {
    /// How to reach the configured Redis (nil for the memory store): address or sentinels,
    /// credentials, database, TLS. The TLS files are read here; failures name their key.
    public static func endpoint(_ store: GatewayConfiguration.Store, commandTimeout: TimeAmount) throws -> StoreEndpoint? {
        guard let url = store.redisURL else { return nil }
        var endpoint = StoreEndpoint(host: url.host, port: url.port, username: url.username, password: url.password, database: url.database,
                                     commandTimeout: commandTimeout)
        if url.tls {
            endpoint.tls = (try TLSContexts.redis(store.tls), store.tls.serverName)
        }
        if let sentinel = store.sentinel {
            let password = try sentinel.password.map { String(decoding: try $0.read(key: "store.sentinel.password"), as: UTF8.self) }
            endpoint.sentinel = StoreEndpoint.Sentinel(masterName: sentinel.masterName, addresses: sentinel.addresses.map { ($0.host, $0.port) },
                                                       password: password)
        }
        if let cluster = store.cluster {
            endpoint.cluster = cluster.addresses.map { ($0.host, $0.port) }
        }
        return endpoint
    }

    /// The Redis backend for `endpoint`; a host that does not resolve is a start-up failure.
    public static func backend(_ endpoint: StoreEndpoint, _ store: GatewayConfiguration.Store, group: MultiThreadedEventLoopGroup, logger: Logger,
                               listener: RedisSessionBackend.Listener? = nil) throws -> RedisSessionBackend {
        do { return try RedisSessionBackend(endpoint, keyPrefix: store.keyPrefix, group: group, logger: logger, listener: listener) } catch {
            if store.sentinel != nil { throw StartupFailure(key: "store.sentinel.addresses", "a sentinel host does not resolve") }
            if store.cluster != nil { throw StartupFailure(key: "store.cluster.addresses", "a cluster node does not resolve") }
            throw StartupFailure(key: "store.redis_url", "the host '\(endpoint.host)' does not resolve")
        }
    }
}
