import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Redis

/// How to reach the session store's Redis: an address or sentinels, credentials, database, TLS.
/// The gateway and the CLI build it from the configuration; only `Sessions` speaks Redis.
public struct StoreEndpoint: Sendable {
    public struct Sentinel: Sendable {
        public var masterName: String
        public var addresses: [(host: String, port: Int)]
        public var password: String?
        public init(masterName: String, addresses: [(host: String, port: Int)], password: String?) {
            self.masterName = masterName
            self.addresses = addresses
            self.password = password
        }
    }

    public var host: String
    public var port: Int
    public var username: String?
    public var password: String?
    public var database: Int
    public var commandTimeout: TimeAmount
    /// The TLS context and the name to verify (`rediss://`).
    public var tls: (context: NIOSSLContext, serverName: String?)?
    public var sentinel: Sentinel?
    /// A Redis Cluster's nodes (asked for the slot map) instead of `host:port`.
    public var cluster: [(host: String, port: Int)]?

    public init(host: String, port: Int, username: String?, password: String?, database: Int, commandTimeout: TimeAmount,
                tls: (context: NIOSSLContext, serverName: String?)? = nil, sentinel: Sentinel? = nil) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.commandTimeout = commandTimeout
        self.tls = tls
        self.sentinel = sentinel
    }

    var configuration: RedisClient.Configuration {
        var c = RedisClient.Configuration(host: host, port: port, username: username, password: password, database: database, commandTimeout: commandTimeout)
        if let tls { c.tls = RedisTLS(context: tls.context, serverName: tls.serverName) }
        if let sentinel {
            c.sentinel = RedisSentinelConfiguration(masterName: sentinel.masterName, addresses: sentinel.addresses.map { RedisAddress(host: $0.host, port: $0.port) },
                                                    password: sentinel.password)
        }
        return c
    }
}

/// The session store on Redis with the fleet's message channel: the store, publishing
/// `FleetMessage`s, and (for a gateway, once `listen` is called) receiving them, following a
/// Sentinel failover. Built once per process; nothing connects before the first use.
///
/// On a Redis Cluster the channel is classic pub/sub, which the cluster broadcasts to every
/// node: the subscriber listens on any node (the next one after a loss), and a message
/// published on any master reaches it.
public final class RedisSessionBackend: Sendable {
    public let store: RedisSessionStore
    private let client: any RedisCommands
    private let channel: String
    private let subscriber: RedisSubscriber?
    private let watcher: RedisSentinelWatcher?
    /// The one server's client (not behind sentinels, not a cluster): `followName`'s.
    private let named: RedisClient?
    private let logger: Logger

    /// The receiving side of the channel.
    public struct Listener: Sendable {
        /// Every message understood, on `loop`.
        public var onMessage: @Sendable (FleetMessage) -> Void
        /// After every (re)subscription: messages may have been missed meanwhile.
        public var onSubscribed: @Sendable () -> Void
        public var loop: any EventLoop
        public init(on loop: any EventLoop, onMessage: @escaping @Sendable (FleetMessage) -> Void, onSubscribed: @escaping @Sendable () -> Void) {
            self.loop = loop
            self.onMessage = onMessage
            self.onSubscribed = onSubscribed
        }
    }

    /// Fails when a host does not resolve. Without a listener (the CLI), nothing subscribes.
    public init(_ endpoint: StoreEndpoint, keyPrefix: String, group: MultiThreadedEventLoopGroup, logger: Logger, listener: Listener? = nil) throws {
        let configuration = endpoint.configuration
        let single: RedisClient?
        if let nodes = endpoint.cluster {
            let cluster = try RedisClusterClient(configuration: .init(seeds: nodes.map { RedisAddress(host: $0.host, port: $0.port) }, node: configuration),
                                                 group: group, logger: logger)
            client = cluster
            single = nil
        } else {
            let client = try RedisClient(configuration: configuration, group: group, logger: logger)
            self.client = client
            single = client
        }
        store = RedisSessionStore(client: client, keyPrefix: keyPrefix)
        channel = keyPrefix + "invalidate"
        named = configuration.sentinel == nil ? single : nil
        self.logger = logger
        guard let listener else {
            subscriber = nil
            watcher = nil
            return
        }
        let onMessage: RedisSubscriber.MessageHandler = { _, payload in
            if let message = FleetMessage(payload: payload) { listener.onMessage(message) }
        }
        let channels = [keyPrefix + "invalidate"]
        let subscriber: RedisSubscriber
        if let nodes = endpoint.cluster {
            subscriber = try RedisSubscriber(configuration: configuration, anyOf: nodes.map { RedisAddress(host: $0.host, port: $0.port) }, channels: channels,
                                             eventLoop: listener.loop, logger: logger, onMessage: onMessage, onConnected: listener.onSubscribed)
        } else {
            subscriber = try RedisSubscriber(configuration: configuration, channels: channels, eventLoop: listener.loop, logger: logger,
                                             onMessage: onMessage, onConnected: listener.onSubscribed)
        }
        self.subscriber = subscriber
        if configuration.sentinel != nil, let client = single {
            watcher = try RedisSentinelWatcher(configuration: configuration, eventLoop: listener.loop, logger: logger) { master in
                logger.notice("redis sentinel: the master moved; reconnecting", metadata: ["master": "\(master)"])
                client.reconnect(unlessConnectedTo: master)
                subscriber.reconnect()
            }
        } else {
            watcher = nil
        }
    }

    /// Resolves `redis_url`'s host again and redials what is connected elsewhere, the
    /// subscription too (a reload: the name may have moved with the old server still up, so
    /// nothing else would make the gateway follow it). Sentinels and cluster nodes are followed
    /// by their own announcements.
    public func followName() async {
        guard let named else { return }
        do {
            let addresses = try await named.followName()
            subscriber?.reconnect(unlessConnectedToAnyOf: addresses)
            logger.info("store.redis_url's host resolved again: connections to another address are redialled",
                        metadata: ["address": "\(addresses.sorted().joined(separator: ","))"])
        } catch {
            logger.warning("store.redis_url's host did not resolve at the reload: the connections stay", metadata: ["error": "\(error)"])
        }
    }

    /// Tells every instance (this one included, if it listens) `message`.
    public func publish(_ message: FleetMessage, on loop: any EventLoop) -> EventLoopFuture<Void> {
        client.send(["PUBLISH", .string(channel), .string(message.payload)], on: loop).map { _ in }
    }

    /// Starts receiving the fleet's messages (and following the sentinels).
    public func listen() {
        subscriber?.start()
        watcher?.start()
    }

    public func shutdown() async {
        await watcher?.stop()
        await subscriber?.stop()
        await client.close()
    }
}
