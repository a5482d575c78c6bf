import GatewayConfig
import Logging
import NIOCore
import NIOPosix
import Redis

/// The session store's Redis, as the configuration describes it: for the gateway and for the
/// `sessions` command alike.
public enum StoreConnection {
    /// How to reach the configured Redis (nil for the memory store): address or sentinels,
    /// credentials, database, TLS. The TLS files are read here; failures name their key.
    public static func configuration(_ store: GatewayConfiguration.Store, commandTimeout: TimeAmount) throws -> RedisClient.Configuration? {
        guard let url = store.redisURL else { return nil }
        var configuration = RedisClient.Configuration(
            host: url.host, port: url.port, username: url.username, password: url.password, database: url.database, commandTimeout: commandTimeout)
        if url.tls {
            configuration.tls = RedisTLS(context: try TLSContexts.redis(store.tls), serverName: store.tls.serverName)
        }
        if let sentinel = store.sentinel {
            let password = try sentinel.password.map { String(decoding: try $0.read(key: "store.sentinel.password"), as: UTF8.self) }
            configuration.sentinel = RedisSentinelConfiguration(
                masterName: sentinel.masterName, addresses: sentinel.addresses.map { RedisAddress(host: $0.host, port: $0.port) },
                password: password)
        }
        return configuration
    }

    /// The client for `configuration`; a host that does not resolve is a start-up failure.
    public static func client(_ configuration: RedisClient.Configuration, _ store: GatewayConfiguration.Store, group: MultiThreadedEventLoopGroup,
                                   logger: Logger) throws -> RedisClient {
        do { return try RedisClient(configuration: configuration, group: group, logger: logger) } catch {
            if store.sentinel != nil { throw StartupFailure(key: "store.sentinel.addresses", "a sentinel host does not resolve") }
            throw StartupFailure(key: "store.redis_url", "the host '\(configuration.host)' does not resolve")
        }
    }

}
