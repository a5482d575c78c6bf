import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Redis
import TestSupport
import Testing

/// A managed Redis (ElastiCache, Memorystore, Azure Cache) fails over by promoting a replica,
/// demoting the primary and moving the name clients dial. The client must notice the demotion
/// at the first refused write and follow the name, with no restart. The name is a test seam
/// (`Configuration.resolver`) so that it moves without DNS.
@Suite("Redis: a standalone client follows its primary", .serialized, .timeLimit(.minutes(2)))
struct RedisPrimaryFollowingTests {
    /// The answer to a write, as the test reads it.
    enum Outcome: Equatable {
        case written
        case failed(RedisError)
    }

    static func write(_ client: RedisClient, _ value: String) async -> Outcome {
        do {
            _ = try await client.send(["SET", "k", .string(value)])
            return .written
        } catch let error as RedisError {
            return .failed(error)
        } catch {
            return .failed(.unavailable)
        }
    }

    @Test("a demoted primary: the first write is refused (READONLY, or ROLE on the reconnect Redis forces), a reconnect to the replica is refused (ROLE), and once the name moves writes reach the new primary with its data")
    func demotionAndMovedName() async throws {
        let pair = try await blocking { try RedisReplicatedPair() }  // seconds, off the cooperative pool
        defer { pair.stop() }
        let (a, b) = (pair.primary, pair.replica)

        let at = NIOLockedValueBox(a.port)
        var configuration = RedisClient.Configuration(host: "redis.example.internal", port: 6379, commandTimeout: .seconds(2),
                                                      minimumBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
        configuration.resolver = { address in
            #expect(address == RedisAddress(host: "redis.example.internal", port: 6379), "the configured name is what is resolved")
            return RedisAddress(host: "127.0.0.1", port: at.withLockedValue { $0 })
        }
        let client = try RedisClient(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
        try await withTeardown(client, stop: { await $0.close() }) { client in
            #expect(await Self.write(client, "before") == .written)
            try await Poll.within(.seconds(10), "the write reaches the replica") {
                (try? RedisCommand.send(["GET", "k"], port: b.port))?.string == "before"
            }

            // The failover: B promoted, A demoted to its replica; the name still points at A.
            try pair.failOver()
            // Redis drops its clients when it is demoted (then the write dials again and meets
            // ROLE) or answers READONLY to a connection it kept: refused either way.
            let during = await Self.write(client, "during")
            #expect(during == .failed(.notMaster) || during == .failed(.server("READONLY You can't write against a read only replica.")),
                    "a write to the demoted primary: \(during)")
            // Dialled again by name, A is refused for what it is now: a replica.
            let refused = await Self.firstOutcome(client, within: .seconds(10)) { $0 == .failed(.notMaster) }
            #expect(refused == .failed(.notMaster), "the reconnect to the demoted primary")

            // The name moves to the new primary: the next connect follows it.
            at.withLockedValue { $0 = b.port }
            let moved = ContinuousClock.now
            let written = await Self.firstOutcome(client, within: .seconds(10)) { $0 == .written }
            #expect(written == .written, "writes reach the new primary")
            print("redis primary following: writes again \(ContinuousClock.now - moved) after the name moved")
            #expect((try RedisCommand.send(["GET", "k"], port: b.port)).string == "after", "on B, which kept A's data")
        }
    }

    /// Writes "after" every 20 ms until `done` holds for the outcome (or `limit` passes); the last outcome.
    static func firstOutcome(_ client: RedisClient, within limit: Duration, _ done: (Outcome) -> Bool) async -> Outcome? {
        let deadline = ContinuousClock.now + limit
        var last: Outcome?
        while ContinuousClock.now < deadline {
            let outcome = await write(client, "after")
            last = outcome
            if done(outcome) { return outcome }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return last
    }
}
