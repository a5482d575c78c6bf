import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TestSupport
import Testing

@testable import Redis

/// Redis Sentinel: the client, the subscriber and the watcher against a master, a replica and
/// three sentinels; the master is killed (or frozen, or handed over) and the replica promoted.
@Suite("Redis Sentinel failover against redis-server", .serialized, .timeLimit(.minutes(2)))
struct RedisSentinelTests {
    enum Event: Equatable, Sendable {
        case connected
        case message(String)
        /// The watcher's `onSwitch`: the new master's address.
        case switched(String)
    }

    /// The gateway's wiring (AuthCore): a client, a subscriber to `sg:invalidate`, and a
    /// watcher that moves both at `+switch-master`. Backoff as in production (50 ms up to 5 s),
    /// so that recovering faster than the backoff is the watcher's doing.
    struct Wiring {
        let client: RedisClient
        let subscriber: RedisSubscriber
        let watcher: RedisSentinelWatcher
        let events: EventLog<Event>

        init(_ configuration: RedisClient.Configuration) throws {
            let events = EventLog<Event>()
            let loop = MultiThreadedEventLoopGroup.singleton.next()
            let client = try RedisClient(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
            let subscriber = try RedisSubscriber(
                configuration: configuration, channels: ["sg:invalidate"], eventLoop: loop, logger: Logger(label: "test"),
                onMessage: { _, payload in events.append(.message(String(decoding: payload, as: UTF8.self))) },
                onConnected: { events.append(.connected) })
            watcher = try RedisSentinelWatcher(configuration: configuration, eventLoop: loop, logger: Logger(label: "test")) { master in
                events.append(.switched(master))
                client.reconnect(unlessConnectedTo: master)
                subscriber.reconnect()
            }
            self.client = client
            self.subscriber = subscriber
            self.events = events
        }

        func start() {
            subscriber.start()
            watcher.start()
        }

        func stop() async {
            await watcher.stop()
            await subscriber.stop()
            await client.close()
        }
    }

    /// Waits until the client's connection on `loop` answers (the first dial asks a sentinel,
    /// dials the master and checks its ROLE: on loaded cores that can outlast the first
    /// command, which then fails fast as `unavailable`). Not what any test here is about.
    static func ready(_ client: RedisClient, on loop: (any EventLoop)? = nil) async throws {
        let deadline = ContinuousClock.now + .seconds(15)
        while true {
            do {
                _ = try await client.send(["PING"], on: loop).get()
                return
            } catch RedisError.unavailable where ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    static func configuration(_ cluster: RedisSentinelCluster, masterName: String? = nil) -> RedisClient.Configuration {
        // host:port name nothing: with sentinels they are not dialled. A second per command: a
        // frozen master's commands time out, and the 2 shared cores need more than 250 ms.
        var configuration = RedisClient.Configuration(host: "127.0.0.1", port: 1, commandTimeout: .seconds(1))
        configuration.sentinel = RedisSentinelConfiguration(masterName: masterName ?? cluster.masterName,
                                                            addresses: cluster.sentinelPorts.map { RedisAddress(host: "127.0.0.1", port: $0) })
        return configuration
    }

    enum Outage: String, CustomTestStringConvertible, Sendable {
        /// SIGKILL: its connections are reset, new ones refused.
        case killed
        /// SIGSTOP, as a partition looks: connections stay open and silent; only the watcher's
        /// switch moves them.
        case frozen

        var testDescription: String { rawValue }
    }

    @Test("the master is killed or frozen: SET works again on the promoted replica, the watcher reports it, pub/sub follows",
          arguments: [Outage.killed, .frozen])
    func failover(_ outage: Outage) async throws {
        let cluster = try await blocking { try RedisSentinelCluster() }
        defer { cluster.stop() }
        let wiring = try Wiring(Self.configuration(cluster))
        wiring.start()
        #expect(await wiring.events.wait(within: .seconds(10)) { $0.contains(.connected) }, "the subscriber subscribes on the master")
        for loop in MultiThreadedEventLoopGroup.singleton.makeIterator() { try await Self.ready(wiring.client, on: loop) }
        #expect(try await wiring.client.send(["SET", "before", "1"]) == .simpleString("OK"))
        let oldMaster = try #require(cluster.reportedMasterPort())
        #expect(oldMaster == cluster.servers[0].port)
        // The watcher must be listening before the outage, or the switch would pass unseen.
        let deadline = ContinuousClock.now + .seconds(10)
        while cluster.sentinelSubscriptions() == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        #expect(cluster.sentinelSubscriptions() == 1, "the watcher subscribed to +switch-master on one sentinel")
        try await cluster.waitForReplication()

        switch outage {
        case .killed: try cluster.crashMaster()
        case .frozen: try cluster.freezeMaster()
        }
        let outageStarted = ContinuousClock.now
        async let promotion = cluster.waitForNewMaster(replacing: oldMaster)
        // Every 100 ms, as a busy gateway would: what the callers see.
        var firstSuccess: ContinuousClock.Instant?
        var failures: [String: Int] = [:]
        while firstSuccess == nil, ContinuousClock.now - outageStarted < .seconds(30) {
            do {
                _ = try await wiring.client.send(["SET", "after", "1"])
                firstSuccess = .now
            } catch {
                failures["\(error)", default: 0] += 1
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        let (newMaster, promoted) = try await promotion
        #expect(newMaster == cluster.servers[1].port)
        let recovered = try #require(firstSuccess, "no SET succeeded within 30 s of the outage; failures: \(failures)")
        print("sentinel failover (RedisClient, master \(outage)): outage → first successful SET \(recovered - outageStarted); promotion seen by a sentinel → first SET \(recovered - promoted) "
              + "(outage → promotion \(promoted - outageStarted)); failures meanwhile: \(failures)")
        #expect(recovered - promoted < .seconds(5), "the client follows the promotion well within its 5 s maximum backoff")
        // The first success was on one loop's connection; the other loop's may still be waiting
        // out its timeout or backoff (a frozen master): what follows is about the new master.
        for loop in MultiThreadedEventLoopGroup.singleton.makeIterator() { try await Self.ready(wiring.client, on: loop) }
        #expect(try await wiring.client.send(["GET", "before"]).string == "1", "the write replicated before the outage survived")
        guard case .array(let role?) = try await wiring.client.send(["ROLE"]) else { Issue.record("ROLE: not an array"); return }
        #expect(role.first?.string == "master")

        #expect(await wiring.events.wait(within: .seconds(10)) { $0.contains(.switched("127.0.0.1:\(newMaster)")) },
                "onSwitch names the new master; events: \(wiring.events.all)")
        // The subscriber resubscribed on the new master: a message published there arrives. (Sent
        // again if the watcher's reconnect drops the connection it went to: onConnected then
        // covers the loss, as the gateway's cache flush does.)
        var arrived = false
        for attempt in 1...10 where !arrived {
            let payload = "after failover \(attempt)"
            let receivers = try await wiring.client.send(["PUBLISH", "sg:invalidate", .string(payload)]).int ?? 0
            arrived = receivers > 0 ? await wiring.events.wait(within: .seconds(2)) { $0.contains(.message(payload)) } : false
            if !arrived { try await Task.sleep(for: .milliseconds(200)) }  // pacing: the subscriber is (re)subscribing
        }
        #expect(arrived, "no message published after the failover reached the subscriber; events: \(wiring.events.all)")
        await wiring.stop()
    }

    @Test("a switchover (SENTINEL FAILOVER): the old master stays up as a replica; every connection moves to the new master")
    func switchover() async throws {
        let cluster = try await blocking { try RedisSentinelCluster() }
        defer { cluster.stop() }
        let wiring = try Wiring(Self.configuration(cluster))
        wiring.start()
        // A connection on every event loop, all to the first master.
        let loops = Array(MultiThreadedEventLoopGroup.singleton.makeIterator())
        for loop in loops {
            try await Self.ready(wiring.client, on: loop)
            #expect(try await wiring.client.send(["SET", "k", "v"], on: loop).get() == .simpleString("OK"))
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while cluster.sentinelSubscriptions() == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        let oldMaster = try #require(cluster.reportedMasterPort())

        #expect(try RedisCommand.send(["SENTINEL", "FAILOVER", cluster.masterName], port: cluster.sentinelPorts[0]) == .string("OK"))
        let (newMaster, promoted) = try await cluster.waitForNewMaster(replacing: oldMaster)
        // The sentinels close the clients of the server they demote (CLIENT KILL); a connection
        // dialled again must reach the new master, not the old one, which still answers reads
        // as a replica (stale, every write refused): the dialer's ROLE check.
        // Which server each connection is on, by its port: the old master still answers ROLE
        // "master" until the sentinels get round to demoting it (once 64 ms after the promotion
        // every connection said "master" from the old server, and the demotion then cut the write).
        func server(on loop: any EventLoop) async -> Int? {
            guard case .array(let parts?)? = try? await wiring.client.send(["CONFIG", "GET", "port"], on: loop).get(), parts.count == 2 else { return nil }
            return parts[1].string.flatMap { Int($0) }
        }
        var moved: ContinuousClock.Instant?
        while moved == nil, ContinuousClock.now - promoted < .seconds(15) {
            var servers: [Int?] = []
            for loop in loops { servers.append(await server(on: loop)) }
            if servers.allSatisfy({ $0 == newMaster }) { moved = .now } else { try await Task.sleep(for: .milliseconds(100)) }
        }
        let done = try #require(moved, "a connection stayed on the demoted master \(oldMaster)")
        print("sentinel switchover: promotion seen by a sentinel → every connection on the new master \(done - promoted)")
        #expect(try await wiring.client.send(["SET", "k", "w"]) == .simpleString("OK"), "writes go to the new master")
        #expect(await wiring.events.wait(within: .seconds(10)) { $0.contains(.switched("127.0.0.1:\(newMaster)")) },
                "onSwitch names the new master; events: \(wiring.events.all)")
        await wiring.stop()
    }

    @Test("a master name no sentinel knows fails with .unknownMaster at once")
    func unknownMaster() async throws {
        let cluster = try await blocking { try RedisSentinelCluster() }
        defer { cluster.stop() }
        let client = try RedisClient(configuration: Self.configuration(cluster, masterName: "nosuchmaster"), group: MultiThreadedEventLoopGroup.singleton,
                                     logger: Logger(label: "test"))
        let started = ContinuousClock.now
        do {
            _ = try await client.send(["PING"])
            Issue.record("PING succeeded")
        } catch let error as RedisError {
            guard case .unknownMaster("nosuchmaster") = error else { Issue.record("got \(error)"); return }
        }
        // `.unknownMaster` is the mechanism (not a timeout, not a connection to some server); the
        // bound only catches a client that keeps retrying (seconds: the cores are shared).
        let elapsed = ContinuousClock.now - started
        #expect(elapsed < .seconds(10), "failed in \(elapsed)")
        await client.close()
    }
}

/// Events from callbacks, kept in order; a test awaits the moment they satisfy a condition.
final class EventLog<Event: Sendable>: Sendable {
    private struct State {
        var events: [Event] = []
        var waiters: [UInt64: (condition: @Sendable ([Event]) -> Bool, continuation: CheckedContinuation<Bool, Never>)] = [:]
        var nextID: UInt64 = 0
        /// Timed out before they were registered.
        var expired: Set<UInt64> = []
    }

    private let state = NIOLockedValueBox(State())

    var all: [Event] { state.withLockedValue { $0.events } }

    func append(_ event: Event) {
        let satisfied = state.withLockedValue { state -> [CheckedContinuation<Bool, Never>] in
            state.events.append(event)
            let events = state.events
            let ready = state.waiters.filter { $0.value.condition(events) }
            for id in ready.keys { state.waiters[id] = nil }
            return ready.values.map(\.continuation)
        }
        satisfied.forEach { $0.resume(returning: true) }
    }

    /// True as soon as the events so far satisfy `condition`; false after `limit`.
    func wait(within limit: Duration, until condition: @escaping @Sendable ([Event]) -> Bool) async -> Bool {
        let id = state.withLockedValue { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        // The continuation is resumed once: by `append` (true) or by this timer (false),
        // whichever removes the waiter first.
        let timer = Task {
            try? await Task.sleep(for: limit)
            let waiter = self.state.withLockedValue { state in
                if state.waiters[id] == nil { state.expired.insert(id) }
                return state.waiters.removeValue(forKey: id)
            }
            waiter?.continuation.resume(returning: false)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            let answer = state.withLockedValue { state -> Bool? in
                if condition(state.events) { return true }
                if state.expired.remove(id) != nil { return false }
                state.waiters[id] = (condition, continuation)
                return nil
            }
            if let answer { continuation.resume(returning: answer) }
        }
    }
}
