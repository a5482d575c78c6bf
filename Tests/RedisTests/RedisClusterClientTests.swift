import Foundation
import Logging
import NIOCore
import NIOPosix
import Redis
import TestSupport
import Testing

/// The cluster client against a real cluster, where a command's retries must fit in one
/// `store.timeout` (the redirect decisions themselves are table-tested in
/// `RedisClusterRedirectTests`).
@Suite("Redis Cluster client", .serialized, .timeLimit(.minutes(2)))
struct RedisClusterClientTests {
    @Test("a redirected command waits no longer than the timeout from its first send, though the node it is sent to never answers")
    func retriesFitInTheTimeout() async throws {
        // Frozen nodes are not failed over meanwhile: a long node timeout.
        let cluster = try await blocking { try RedisClusterProcesses(nodeTimeout: .seconds(10)) }
        defer { cluster.stop() }
        let timeout = TimeAmount.seconds(1)
        // A loop of its own: on the process's shared loops another suite's work held the
        // deadline's timer (1.64 s for a 1 s deadline under make test).
        try await withTeardown(MultiThreadedEventLoopGroup(numberOfThreads: 1), stop: { try? await $0.shutdownGracefully() }) { group in
        let client = try RedisClusterClient(configuration: .init(seeds: cluster.ports.map { RedisAddress(host: "127.0.0.1", port: $0) },
                                                                 node: .init(host: "127.0.0.1", commandTimeout: timeout)),
                                            group: group, logger: Logger(label: "test"))
        let loop = group.next()
        let key = "probe"
        let slot = RedisClusterSlot.of(key)
        let source = try #require(cluster.masterPort(owningSlot: slot))
        let target = try #require(cluster.masterPorts().first { $0 != source })
        let elsewhere = try #require((0..<100_000).lazy.map { "probe\($0)" }.first { cluster.masterPort(owningSlot: RedisClusterSlot.of($0)) == target })
        // Connected to both masters on this loop, the map read.
        _ = try await client.send(["GET", .string(key)], on: loop).get()
        _ = try await client.send(["GET", .string(elsewhere)], on: loop).get()
        // The slot starts moving: the source answers ASK for a key it does not hold.
        _ = try cluster.send(["CLUSTER", "SETSLOT", String(slot), "IMPORTING", try cluster.nodeID(port: source)], port: target)
        _ = try cluster.send(["CLUSTER", "SETSLOT", String(slot), "MIGRATING", try cluster.nodeID(port: target)], port: source)
        let (sourceServer, targetServer) = (try #require(cluster.server(on: source)), try #require(cluster.server(on: target)))
        // The source answers late (after 0.6 s of the second), the target not at all.
        sourceServer.freeze()
        targetServer.freeze()
        defer { targetServer.thaw() }
        // Timed on the client's loop, the thaw scheduled there too: the test's own task, on the
        // process's shared cooperative pool, once woke 1.8 s late under make test (2.46 s
        // "waited" for a reply that had failed at 1 s).
        let (started, finished) = try await loop.submit { () -> (NIODeadline, EventLoopFuture<(NIODeadline, timedOut: Bool)>) in
            let started = NIODeadline.now()
            let reply = client.send(["GET", .string(key)], on: loop)
            loop.scheduleTask(in: .milliseconds(600)) { sourceServer.thaw() }
            return (started, reply.map { _ in (NIODeadline.now(), false) }.flatMapErrorThrowing { error in
                guard case RedisError.timeout = error else { throw error }
                return (NIODeadline.now(), true)
            })
        }.get()
        let (ended, timedOut) = try await finished.get()
        #expect(timedOut, "the target never answers: a timeout")
        let waited = Duration.nanoseconds(Int64(ended.uptimeNanoseconds - started.uptimeNanoseconds))
        // Without the deadline the retry took a timeout of its own: 1.6 s.
        #expect(waited < .milliseconds(1400), "waited \(waited) for a timeout of 1 s")
        await client.close()
        }
    }
}
