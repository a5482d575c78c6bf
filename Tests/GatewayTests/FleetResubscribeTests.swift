import Foundation
import TestSupport
import Testing

/// `FleetSubscriber` (issue 24): after its subscription comes back, messages may have been lost
/// meanwhile, so the local cache forgets everything (`Revocations.resubscribed`).
@Suite("The fleet subscription after a Redis restart", .timeLimit(.minutes(2)))
struct FleetResubscribeTests {
    @Test("Redis restarted empty: once the subscriber is back, the cache is flushed and a session the store lost is no longer admitted")
    func cacheFlushedOnResubscribe() async throws {
        let redis = try TestRedis.start()
        // With an external REDIS_URL there is no process of ours to restart.
        guard let process = redis.process else { return redis.stop() }
        try await SignInHarness.with(store: .redis, redis: redis, localCacheTTL: .seconds(3600)) { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await browser.request("/x").status == 200, "admitted, and cached for an hour")
            process.stop()
            try process.start()  // no persistence: the session is gone from the store
            // The subscriber reconnects with its backoff; until then the cached session stands.
            var status = 200
            let deadline = ContinuousClock.now + .seconds(30)
            while status != 302, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
                status = try await browser.request("/x").status
            }
            #expect(status == 302, "the cache was flushed when the subscription came back: the store says the session is gone")
        }
    }
}
