import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// TLS to Redis (`rediss://`): the client context (trust, client certificate) and the name the
/// server's certificate must carry.
public struct RedisTLS: Sendable {
    public var context: NIOSSLContext
    /// SNI and the verified name; nil: the host dialled (an IP address is verified as such).
    public var serverName: String?

    public init(context: NIOSSLContext, serverName: String? = nil) {
        self.context = context
        self.serverName = serverName
    }
}

/// `host:port` of a Redis server or a sentinel.
public struct RedisAddress: Sendable, Equatable, CustomStringConvertible {
    public var host: String
    public var port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// Redis Sentinel: the sentinels to ask for the current master of `masterName`.
public struct RedisSentinelConfiguration: Sendable {
    public var masterName: String
    public var addresses: [RedisAddress]
    /// AUTH for the sentinels (`requirepass` in sentinel.conf).
    public var password: String?

    public init(masterName: String, addresses: [RedisAddress], password: String? = nil) {
        self.masterName = masterName
        self.addresses = addresses
        self.password = password
    }
}

/// Where a configured address is at this connect (a test's seam: a name moved without DNS).
public typealias RedisNameResolver = @Sendable (RedisAddress) -> RedisAddress

/// Makes ready connections: finds where to connect (the configured address, its name resolved
/// again at every connect, or the master the sentinels name), connects with TLS when
/// configured, runs the setup commands (AUTH, SELECT) and proves the server is a master
/// (`ROLE`): a managed Redis fails over by demoting the primary and moving its name, so a
/// connect that reaches a replica fails and the next one resolves the name again. The command
/// connections, the subscriber and the sentinel watcher all dial through this one type.
struct RedisDialer: Sendable {
    enum Target: Sendable {
        /// One server; a name is resolved at every connect.
        case address(RedisAddress)
        /// The master the sentinels name, asked for at every connect.
        case master(SentinelLocator)
        /// Any of these (the sentinels themselves): tried in turn, one per connect.
        case anyOf(Rotation)
    }

    let target: Target
    let tls: RedisTLS?
    let connectTimeout: TimeAmount
    let commandTimeout: TimeAmount
    let setup: [[RedisArgument]]
    let resolver: RedisNameResolver?

    /// Dials the configured server or, with sentinels, the current master.
    init(configuration: RedisClient.Configuration) throws {
        if let sentinel = configuration.sentinel {
            target = .master(try SentinelLocator(sentinel, tls: configuration.tls, connectTimeout: configuration.connectTimeout,
                                                  commandTimeout: configuration.commandTimeout))
        } else {
            let address = RedisAddress(host: configuration.host, port: configuration.port)
            // A name that does not resolve stops the start; it is resolved again at every connect.
            if configuration.resolver == nil { _ = try Self.resolve(address) }
            target = .address(address)
        }
        resolver = configuration.resolver
        tls = configuration.tls
        connectTimeout = configuration.connectTimeout
        commandTimeout = configuration.commandTimeout
        var setup: [[RedisArgument]] = []
        if let auth = configuration.authCommand { setup.append(auth) }
        if configuration.database != 0 { setup.append(["SELECT", RedisArgument(Int64(configuration.database))]) }
        self.setup = setup
    }

    /// A dialer of sentinels or cluster nodes (their names are resolved by the system's resolver).
    init(target: Target, tls: RedisTLS?, connectTimeout: TimeAmount, commandTimeout: TimeAmount, setup: [[RedisArgument]]) {
        self.target = target
        self.resolver = nil
        self.tls = tls
        self.connectTimeout = connectTimeout
        self.commandTimeout = commandTimeout
        self.setup = setup
    }

    /// Where this dialer goes, for log lines.
    var label: String {
        switch target {
        case .address(let address): return "\(address)"
        case .master(let locator): return "sentinel master '\(locator.configuration.masterName)'"
        case .anyOf(let rotation): return "sentinels \(rotation.addresses.map(\.description).joined(separator: ","))"
        }
    }

    /// A connected channel with `handler` last in its pipeline, set up and ready for commands.
    func dial(on loop: any EventLoop, handler: RedisConnectionHandler) -> EventLoopFuture<any Channel> {
        let located: EventLoopFuture<RedisAddress>
        let role: RoleCheck
        switch target {
        case .address(let address): located = loop.makeSucceededFuture(address); role = .unlessRefused
        case .master(let locator): located = locator.locate(on: loop); role = .required
        case .anyOf(let rotation): located = loop.makeSucceededFuture(rotation.next()); role = .none
        }
        let bound = NIOLoopBound(handler, eventLoop: loop)
        let this = self
        let ready = located.flatMap { address in
            this.connect(address, on: loop, handler: bound).flatMap { channel in
                this.prepare(channel, handler: bound.value, role: role, on: loop).map { channel }
            }
        }
        guard case .anyOf(let rotation) = target else { return ready }
        // The next connect tries the next sentinel.
        return ready.flatMapErrorThrowing { error in
            rotation.failed()
            throw error
        }
    }

    private func connect(_ address: RedisAddress, on loop: any EventLoop,
                         handler: NIOLoopBound<RedisConnectionHandler>) -> EventLoopFuture<any Channel> {
        let tls = self.tls
        let bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(connectTimeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    if let tls {
                        let name = tls.serverName ?? (Self.isIPAddress(address.host) ? nil : address.host)
                        try sync.addHandler(NIOSSLClientHandler(context: tls.context, serverHostname: name))
                    }
                    try sync.addHandler(handler.value)
                }
            }
        // NIO's resolver runs getaddrinfo off the loop, at every connect: a moved name is followed.
        let at = resolver?(address) ?? address
        if let ip = try? SocketAddress(ipAddress: at.host, port: at.port) { return bootstrap.connect(to: ip) }
        return bootstrap.connect(host: at.host, port: at.port)
    }

    /// Whether a connect proves the server is a master: behind sentinels it must (`ROLE`
    /// refused fails the connect); a standalone server must unless its ACL or a rename refuses
    /// `ROLE`; a sentinel is not asked.
    enum RoleCheck { case required, unlessRefused, none }

    /// Runs the setup commands and `ROLE`, pipelined; with TLS and nothing to set up, a `PING`,
    /// so that a failed handshake fails the connect rather than the first command.
    private func prepare(_ channel: any Channel, handler: RedisConnectionHandler, role: RoleCheck, on loop: any EventLoop) -> EventLoopFuture<Void> {
        var commands = setup
        if role != .none { commands.append(["ROLE"]) } else if commands.isEmpty, tls != nil { commands.append(["PING"]) }
        guard !commands.isEmpty else { return loop.makeSucceededVoidFuture() }
        var replies = commands.map { handler.send($0, timeout: commandTimeout, on: loop, flush: false) }
        handler.flush()
        if role != .none {
            replies[replies.count - 1] = replies[replies.count - 1].flatMapThrowing { answer in
                if case .array(let parts?) = answer, parts.first?.string != "master" { throw RedisError.notMaster }
                return answer
            }.flatMapErrorThrowing { error in
                guard role == .unlessRefused, let refused = error as? RedisError, refused.isRefusedCommand else { throw error }
                return .bulkString(nil)  // not proved; the first write's READONLY will tell
            }
        }
        return EventLoopFuture.andAllSucceed(replies, on: loop).flatMapErrorThrowing { error in
            channel.close(promise: nil)
            throw error
        }
    }

    static func resolve(_ address: RedisAddress) throws -> SocketAddress {
        try (try? SocketAddress(ipAddress: address.host, port: address.port))
            ?? SocketAddress.makeAddressResolvingHost(address.host, port: address.port)
    }

    /// Every address `address` resolves to (`ip:port`), as `getaddrinfo` answers; blocking.
    static func resolveAll(_ address: RedisAddress) throws -> Set<String> {
        if isIPAddress(address.host) { return [address.description] }
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>? = nil
        let rc = getaddrinfo(address.host, String(address.port), &hints, &list)
        guard rc == 0, let first = list else { throw RedisError.unavailable }
        defer { freeaddrinfo(first) }
        var found: Set<String> = []
        var next: UnsafeMutablePointer<addrinfo>? = first
        while let info = next {
            if let sockaddr = info.pointee.ai_addr {
                var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
                let ok: Bool
                switch Int32(sockaddr.pointee.sa_family) {
                case AF_INET:
                    ok = sockaddr.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { var a = $0.pointee.sin_addr; return inet_ntop(AF_INET, &a, &text, socklen_t(text.count)) != nil }
                case AF_INET6:
                    ok = sockaddr.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { var a = $0.pointee.sin6_addr; return inet_ntop(AF_INET6, &a, &text, socklen_t(text.count)) != nil }
                default:
                    ok = false
                }
                if ok { found.insert(RedisAddress(host: String(cString: text), port: address.port).description) }
            }
            next = info.pointee.ai_next
        }
        return found
    }

    static func isIPAddress(_ host: String) -> Bool {
        (try? SocketAddress(ipAddress: host, port: 0)) != nil
    }

    /// Sends `command` on a fresh connection and closes it (asking a sentinel).
    func ask(_ command: [RedisArgument], on loop: any EventLoop) -> EventLoopFuture<RESPValue> {
        let handler = RedisConnectionHandler()
        let bound = NIOLoopBound(handler, eventLoop: loop)
        let timeout = commandTimeout
        return dial(on: loop, handler: handler).flatMap { channel in
            let reply = bound.value.send(command, timeout: timeout, on: loop)
            return reply.always { _ in channel.close(promise: nil) }
        }
    }
}

/// A list of addresses used in turn; the one that last worked is tried first.
final class Rotation: Sendable {
    let addresses: [RedisAddress]
    private let index = NIOLockedValueBox(0)

    /// Names that do not resolve stop the start; each is resolved again at every connect.
    init(_ addresses: [RedisAddress]) throws {
        for address in addresses { _ = try RedisDialer.resolve(address) }
        self.addresses = addresses
    }

    /// The preferred address; `failed()` moves on to the next.
    func next() -> RedisAddress { addresses[index.withLockedValue { $0 } % addresses.count] }
    func failed() { index.withLockedValue { $0 = ($0 + 1) % addresses.count } }
}

/// Asks the sentinels, in turn, where the master of `masterName` is
/// (`SENTINEL get-master-addr-by-name`).
final class SentinelLocator: Sendable {
    let configuration: RedisSentinelConfiguration
    let sentinels: Rotation
    private let dialer: RedisDialer

    init(_ configuration: RedisSentinelConfiguration, tls: RedisTLS?, connectTimeout: TimeAmount, commandTimeout: TimeAmount) throws {
        self.configuration = configuration
        let sentinels = try Rotation(configuration.addresses)
        self.sentinels = sentinels
        dialer = RedisDialer(target: .anyOf(sentinels), tls: tls, connectTimeout: connectTimeout, commandTimeout: commandTimeout,
                             setup: configuration.password.map { [["AUTH", .string($0)]] } ?? [])
    }

    /// The master's address, from the first sentinel that knows it.
    func locate(on loop: any EventLoop) -> EventLoopFuture<RedisAddress> {
        ask(remaining: configuration.addresses.count, on: loop)
    }

    private func ask(remaining: Int, on loop: any EventLoop) -> EventLoopFuture<RedisAddress> {
        let name = configuration.masterName
        return dialer.ask(["SENTINEL", "get-master-addr-by-name", .string(name)], on: loop).flatMapThrowing { reply -> RedisAddress in
            guard case .array(let parts?) = reply, parts.count == 2, let host = parts[0].string, let port = parts[1].string.flatMap({ Int($0) }) else {
                throw RedisError.unknownMaster(name)
            }
            return RedisAddress(host: host, port: port)
        }.flatMapError { error in
            // A sentinel that could not be reached was passed over by the dialer already.
            if case .unknownMaster = error as? RedisError { self.sentinels.failed() }
            guard remaining > 1 else {
                return loop.makeFailedFuture((error as? RedisError).map { $0 == .unavailable || $0 == .timeout ? RedisError.sentinel("no sentinel answered") : $0 }
                                             ?? RedisError.sentinel("no sentinel answered"))
            }
            return self.ask(remaining: remaining - 1, on: loop)
        }
    }
}

/// Follows failovers: subscribed to `+switch-master` on one sentinel at a time (the next one
/// after a loss), it calls `onSwitch` when the master of `masterName` changes, so that
/// connections move to the new master at once instead of at their next failure.
public final class RedisSentinelWatcher: Sendable {
    private let subscriber: RedisSubscriber

    public init(configuration: RedisClient.Configuration, eventLoop: any EventLoop, logger: Logger, onSwitch: @escaping @Sendable (String) -> Void) throws {
        guard let sentinel = configuration.sentinel else { throw RedisError.sentinel("no sentinels configured") }
        let dialer = RedisDialer(target: .anyOf(try Rotation(sentinel.addresses)), tls: configuration.tls, connectTimeout: configuration.connectTimeout,
                                 commandTimeout: configuration.commandTimeout, setup: sentinel.password.map { [["AUTH", .string($0)]] } ?? [])
        let name = sentinel.masterName
        subscriber = RedisSubscriber(
            dialer: dialer, configuration: configuration, channels: ["+switch-master"], eventLoop: eventLoop, logger: logger,
            onMessage: { _, payload in
                // "<master name> <old ip> <old port> <new ip> <new port>"
                let words = String(decoding: payload, as: UTF8.self).split(separator: " ")
                guard words.count == 5, words[0] == name else { return }
                onSwitch("\(words[3]):\(words[4])")
            },
            onConnected: {})
    }

    public func start() { subscriber.start() }
    public func stop() async { await subscriber.stop() }
}

extension Channel {
    /// The server it is connected to, as `RedisAddress` names it (`ip:port`).
    var redisPeer: String? {
        guard let remote = remoteAddress, let ip = remote.ipAddress, let port = remote.port else { return nil }
        return RedisAddress(host: ip, port: port).description
    }
}
