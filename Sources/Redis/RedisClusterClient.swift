import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// Redis Cluster: the slot map from `CLUSTER SLOTS`, one `RedisClient` per master (a pipelined
/// connection per event loop each), and every command sent to the master of its key's slot.
/// What a cluster answers instead of a reply is decided by `RedisClusterRedirect` — `MOVED`
/// refreshes the map and goes where it says, `ASK` goes there once after `ASKING`, `TRYAGAIN`
/// and `CLUSTERDOWN` wait a moment, a node that cannot be reached refreshes the map — and every
/// retry fits in `store.timeout` from the first send: a request never waits longer.
public final class RedisClusterClient: RedisCommands {
    public struct Configuration: Sendable {
        /// Nodes to ask for the slot map (any of them; list several).
        public var seeds: [RedisAddress]
        /// Credentials, TLS and timeouts for every node (its host and port are the node's).
        public var node: RedisClient.Configuration

        public init(seeds: [RedisAddress], node: RedisClient.Configuration) {
            self.seeds = seeds
            self.node = node
        }
    }

    private struct State {
        var map: RedisSlotMap?
        var nodes: [String: (address: RedisAddress, client: RedisClient)] = [:]
        /// The map being read, for every caller that needs it meanwhile.
        var refreshing: EventLoopFuture<RedisSlotMap>?
    }

    private let configuration: Configuration
    private let group: MultiThreadedEventLoopGroup
    private let logger: Logger
    private let state = NIOLockedValueBox(State())

    /// Resolves the seeds once, here (blocking: not on an event loop), as `RedisClient` does its
    /// host, so that a name that does not resolve stops the start; connects nowhere before the
    /// first command.
    public init(configuration: Configuration, group: MultiThreadedEventLoopGroup, logger: Logger) throws {
        guard !configuration.seeds.isEmpty else { throw RedisError.server("no cluster nodes configured") }
        for seed in configuration.seeds { _ = try RedisDialer.resolve(seed) }
        self.configuration = configuration
        self.group = group
        self.logger = logger
    }

    private var timeout: TimeAmount { configuration.node.commandTimeout }

    // MARK: RedisCommands

    public func send(_ arguments: [RedisArgument], on eventLoop: (any EventLoop)?) -> EventLoopFuture<RESPValue> {
        let loop = eventLoop ?? group.next()
        return attempt(RedisClusterRedirect.slot(of: arguments), on: loop, deadline: .now() + timeout, at: nil) { client, loop, asking in
            guard asking else { return client.send(arguments, on: loop) }
            return client.sendAll([["ASKING"], arguments], on: loop).map { $0[1] }
        }
    }

    /// A `MULTI` block goes to its slot's master as one block; any other pipeline's commands are
    /// each routed (and retried) on their own, the replies in order.
    public func sendAll(_ commands: [[RedisArgument]], on eventLoop: (any EventLoop)?) -> EventLoopFuture<[RESPValue]> {
        let loop = eventLoop ?? group.next()
        guard let first = commands.first, RedisClusterRedirect.name(of: first) == "MULTI" else {
            return EventLoopFuture.whenAllSucceed(commands.map { send($0, on: loop) }, on: loop)
        }
        let slot = commands.lazy.compactMap(RedisClusterRedirect.slot(of:)).first
        // A block moving in the middle of a migration is retried, not asked for: `ASKING` holds for one command.
        return attempt(slot, on: loop, deadline: .now() + timeout, at: nil, askable: false) { client, loop, _ in
            client.sendAll(commands, on: loop)
        }
    }

    public func scan(matching pattern: String, on eventLoop: any EventLoop) -> EventLoopFuture<[String]> {
        map(on: eventLoop).flatMap { map in
            let scans = map.masters.map { master in
                self.client(for: master).map { $0.scan(matching: pattern, on: eventLoop) } ?? eventLoop.makeFailedFuture(RedisError.unavailable)
            }
            return EventLoopFuture.whenAllSucceed(scans, on: eventLoop).map { $0.flatMap { $0 } }
        }
    }

    /// Closes every node's connections.
    public func close() async {
        for node in state.withLockedValue({ Array($0.nodes.values) }) { await node.client.close() }
    }

    // MARK: routing

    /// Sends with `body` to the node for `slot` (or `node`, once redirected), retrying as the
    /// cluster's answer says while `deadline` allows.
    private func attempt<Reply: Sendable>(_ slot: Int?, on loop: any EventLoop, deadline: NIODeadline, at node: RedisClusterRedirect.Target?,
                                          askable: Bool = true,
                                          _ body: @escaping @Sendable (RedisClient, any EventLoop, _ asking: Bool) -> EventLoopFuture<Reply>) -> EventLoopFuture<Reply> {
        let target: EventLoopFuture<(RedisAddress, Bool)>
        if let node {
            target = loop.makeSucceededFuture((node.address, node.asking))
        } else {
            target = map(on: loop).flatMapThrowing { map in
                // A command without a key goes to any master.
                guard let address = slot.map(map.master(forSlot:)) ?? map.masters.first else { throw RedisError.server("CLUSTERDOWN no master serves the slot") }
                return (address, false)
            }
        }
        return target.flatMap { address, asking in
            guard let client = self.client(for: address) else { return loop.makeFailedFuture(RedisError.unavailable) }
            let sent = body(client, loop, asking)
            // A retry has less time left than a command's own timeout: held to the deadline.
            return deadline - .now() < self.timeout ? Self.bounded(sent, by: deadline, on: loop) : sent
        }.flatMapError { error in
            let decision = RedisClusterRedirect.decide(error as? RedisError ?? .unavailable, askable: askable, remaining: deadline - .now())
            switch decision {
            case .fail:
                return loop.makeFailedFuture(error)
            case .retry(let next, let refresh, let delay):
                if refresh { self.invalidate() }
                let again: @Sendable () -> EventLoopFuture<Reply> = { self.attempt(slot, on: loop, deadline: deadline, at: next, askable: askable, body) }
                guard delay > .zero else { return again() }
                return loop.scheduleTask(in: delay) {}.futureResult.flatMap(again)
            }
        }
    }

    /// `future`, or `RedisError.timeout` at `deadline` if it has not completed by then.
    private static func bounded<Reply: Sendable>(_ future: EventLoopFuture<Reply>, by deadline: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<Reply> {
        let promise = loop.makePromise(of: Reply.self)
        let done = NIOLoopBoundBox(false, eventLoop: loop)
        let timer = loop.scheduleTask(deadline: deadline) {
            guard !done.value else { return }
            done.value = true
            promise.fail(RedisError.timeout)
        }
        future.hop(to: loop).whenComplete { result in
            timer.cancel()
            guard !done.value else { return }
            done.value = true
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    /// The client of the node at `address`, made on first use; nil when its host does not resolve.
    private func client(for address: RedisAddress) -> RedisClient? {
        let key = address.description
        if let known = state.withLockedValue({ $0.nodes[key]?.client }) { return known }
        var node = configuration.node
        node.host = address.host
        node.port = address.port
        node.database = 0  // a cluster has only database 0
        // An IP address (as nodes announce themselves) resolves without blocking.
        guard let made = try? RedisClient(configuration: node, group: group, logger: logger) else { return nil }
        return state.withLockedValue { s in
            if let raced = s.nodes[key] { return raced.client }
            s.nodes[key] = (address, made)
            return made
        }
    }

    /// Forgets the map: the next command reads it again.
    private func invalidate() {
        state.withLockedValue { $0.map = nil }
    }

    /// The slot map, read once for every caller waiting on it.
    private func map(on loop: any EventLoop) -> EventLoopFuture<RedisSlotMap> {
        let (known, pending, mine) = state.withLockedValue { s -> (RedisSlotMap?, EventLoopFuture<RedisSlotMap>?, EventLoopPromise<RedisSlotMap>?) in
            if let map = s.map { return (map, nil, nil) }
            if let refreshing = s.refreshing { return (nil, refreshing, nil) }
            let promise = loop.makePromise(of: RedisSlotMap.self)
            s.refreshing = promise.futureResult
            return (nil, nil, promise)
        }
        if let known { return loop.makeSucceededFuture(known) }
        if let pending { return pending.hop(to: loop) }
        let promise = mine!
        readMap(from: knownThenSeeds(), on: loop).whenComplete { result in
            self.state.withLockedValue { s in
                s.refreshing = nil
                if case .success(let map) = result { s.map = map }
            }
            if case .success(let map) = result {
                self.logger.debug("redis cluster: slot map read", metadata: ["masters": .stringConvertible(map.masters.count)])
            }
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    /// The nodes already dialled first (the masters of the last map among them), then the seeds.
    private func knownThenSeeds() -> [RedisAddress] {
        let known = state.withLockedValue { s in s.nodes.values.map(\.address) }
        return known + configuration.seeds.filter { seed in !known.contains(seed) }
    }

    /// `CLUSTER SLOTS` from the first node that answers with a map covering every slot (a node
    /// still learning of a failover may not; the next is asked).
    private func readMap(from nodes: [RedisAddress], on loop: any EventLoop, lastError: (any Error)? = nil) -> EventLoopFuture<RedisSlotMap> {
        guard let node = nodes.first else {
            return loop.makeFailedFuture(lastError ?? RedisError.unavailable)
        }
        guard let client = client(for: node) else { return readMap(from: Array(nodes.dropFirst()), on: loop, lastError: RedisError.unavailable) }
        return client.send(["CLUSTER", "SLOTS"], on: loop).flatMapThrowing { reply in
            guard let map = RedisSlotMap(clusterSlots: reply, asked: node) else { throw RedisError.server("unexpected reply to CLUSTER SLOTS") }
            guard map.coversAllSlots else { throw RedisError.server("CLUSTERDOWN the slot map has gaps") }
            return map
        }.flatMapError { error in
            self.readMap(from: Array(nodes.dropFirst()), on: loop, lastError: error)
        }
    }
}

/// What to do with a cluster's answer instead of a reply: a pure decision (table-tested).
public enum RedisClusterRedirect {
    /// Where to send next.
    public struct Target: Equatable, Sendable {
        public var address: RedisAddress
        /// `ASK`: precede the command with `ASKING`.
        public var asking: Bool

        public init(address: RedisAddress, asking: Bool) {
            self.address = address
            self.asking = asking
        }
    }

    public enum Decision: Equatable, Sendable {
        case fail
        /// Again at `target` (nil: the slot's master by the map), after `refresh`ing the map when
        /// asked, in `after`.
        case retry(Target?, refresh: Bool, after: TimeAmount)
    }

    /// How long a `TRYAGAIN` (keys of a multi-key command split by a migration) or `CLUSTERDOWN`
    /// (a failover under way) waits before the next try.
    public static let pause = TimeAmount.milliseconds(20)

    public static func decide(_ error: RedisError, askable: Bool, remaining: TimeAmount) -> Decision {
        guard remaining > .zero else { return .fail }
        switch error {
        case .server(let reply):
            switch reply.kind {
            case .moved(let address): return .retry(Target(address: address, asking: false), refresh: true, after: .zero)
            case .ask(let address):
                return askable ? .retry(Target(address: address, asking: true), refresh: false, after: .zero)
                               : .retry(nil, refresh: false, after: min(pause, remaining))
            case .tryAgain: return .retry(nil, refresh: false, after: min(pause, remaining))
            case .clusterDown: return .retry(nil, refresh: true, after: min(pause, remaining))
            default: return .fail
            }
        case .unavailable, .notMaster:
            // The node is down, never reached, or demoted: the map may name its replacement.
            return .retry(nil, refresh: true, after: min(pause, remaining))
        default:
            // A timeout used the time up; a protocol or TLS error will not mend by retrying.
            return .fail
        }
    }

    /// `host:port` as a cluster names a node (`MOVED 3999 127.0.0.1:6381`; IPv6 hosts hold colons).
    /// The upper-cased command name.
    static func name(of command: [RedisArgument]) -> String? {
        guard let first = command.first else { return nil }
        return String(decoding: first.utf8, as: UTF8.self).uppercased()
    }

    /// The slot of a command's key; nil for a command without one (`PING`, `PUBLISH`, `MULTI`).
    public static func slot(of command: [RedisArgument]) -> Int? {
        switch name(of: command) {
        case nil, "MULTI", "EXEC", "DISCARD", "PING", "PUBLISH", "SCAN", "INFO", "CLUSTER", "ASKING", "SCRIPT", "ROLE", "SUBSCRIBE":
            return nil
        case "EVAL", "EVALSHA":
            guard command.count > 3, let keys = Int(String(decoding: command[2].utf8, as: UTF8.self)), keys > 0 else { return nil }
            return RedisClusterSlot.of(command[3].utf8)
        default:
            return command.count > 1 ? RedisClusterSlot.of(command[1].utf8) : nil
        }
    }
}
