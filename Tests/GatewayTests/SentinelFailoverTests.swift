import Foundation
import Gateway
import GatewayConfig
import TestSupport
import Testing

/// Two gateways behind Redis Sentinel (a master, a replica, three sentinels) while the master
/// is killed and the replica promoted: what a signed-in user sees, how long the outage lasts,
/// and that revocation and sign-in work on the new master.
@Suite("Gateway behind Redis Sentinel: failover", .serialized, .timeLimit(.minutes(3)))
struct SentinelFailoverTests {
    @Test("master killed: 503 with the cookie kept meanwhile, the session admitted again on both instances, then logout and sign-in on the new master")
    func failover() async throws {
        let cluster = try await blocking { try RedisSentinelCluster() }
        defer { cluster.stop() }
        // The local cache keeps a session an hour: an instance refusing it soon after a logout
        // elsewhere proves the invalidation reached it over pub/sub.
        try await SignInHarness.with(store: .redis, redis: TestRedis(host: "127.0.0.1", port: 1, database: 0, process: nil),
                                              localCacheTTL: .seconds(3600), configure: { c in
            // The URL carries the credentials and the database; its host is not dialled.
            c.store.redisURL = RedisURL.parse("redis://127.0.0.1:1/0")
            c.store.sentinel = .init(masterName: cluster.masterName, addresses: cluster.sentinelPorts.map { ListenAddress(host: "127.0.0.1", port: $0) })
        }) { h in
            let b = try await h.addInstance()

            let warmup = TestBrowser(gatewayOrigin: h.origin)
            _ = try await warmup.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await warmup.request("/x").status == 200, "sign-in and admission work behind the sentinels")

            // Signed in on A and not requested since: in no instance's cache, so every answer
            // below comes from the store.
            let user = TestBrowser(gatewayOrigin: h.origin)
            _ = try await user.signIn(from: "/x", as: h.simulator.createUser())
            let cookie = try #require(user.cookies["__Host-sessiongate"])
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies = user.cookies
            try await cluster.waitForReplication()
            let upstreamBefore = h.upstream.stats.withLockedValue { $0.requests }

            let oldMaster = try cluster.crashMaster()
            let killed = ContinuousClock.now
            async let promotion = cluster.waitForNewMaster(replacing: oldMaster)

            // The sentinels need over a second (down-after-milliseconds 1000) before they even
            // start the failover: meanwhile the store is unreachable.
            for (instance, browser) in [("A", user), ("B", onB)] {
                let answer = try await browser.request("/x")
                if answer.status == 503 {
                    #expect(answer.headers["set-cookie"].isEmpty, "\(instance): the cookie is never cleared for a store error")
                } else {
                    // Only a machine slow enough for the failover to be over may admit already.
                    #expect(answer.status == 200 && cluster.reportedMasterPort() != oldMaster,
                            "\(instance) during the failover: \(answer.status) \(TestBrowser.visibleText(answer.body).prefix(200))")
                }
            }
            let upstreamDuring = h.upstream.stats.withLockedValue { $0.requests }
            // Polled concurrently on both instances; a store error is a 503 every time, never a sign-out.
            func admitted(_ instance: String, _ browser: TestBrowser) async throws -> ContinuousClock.Instant? {
                try await firstTime(200, within: .seconds(40)) {
                    let answer = try await browser.request("/x")
                    if answer.status != 200 {
                        #expect(answer.status == 503 && answer.headers["set-cookie"].isEmpty, "\(instance) while failing over: \(answer.status)")
                    }
                    return answer.status
                }
            }
            async let admittedOnA = admitted("A", user)
            async let admittedOnB = admitted("B", onB)
            let (newMaster, promoted) = try await promotion
            let (onA, onBAt) = try await (admittedOnA, admittedOnB)
            #expect(newMaster == cluster.servers[1].port, "the replica was promoted")
            let againOnA = try #require(onA, "A does not admit the session within 40 s of the kill")
            let againOnB = try #require(onBAt, "B does not admit the session within 40 s of the kill")
            print("gateway behind sentinel: kill → promotion seen by a sentinel \(promoted - killed); session admitted again on A \(againOnA - killed) "
                  + "after the kill (\(againOnA - promoted) after the promotion), on B \(againOnB - killed) (\(againOnB - promoted))")
            #expect(againOnA - promoted <= .seconds(20) && againOnB - promoted <= .seconds(20), "both instances follow the new master")
            #expect(upstreamDuring == upstreamBefore, "the upstream saw nothing while the store was unreachable")
            #expect(user.cookies["__Host-sessiongate"] == cookie && onB.cookies["__Host-sessiongate"] == cookie, "the same session, never re-issued")

            // Both instances' subscribers are on the new master (and no late +switch-master will
            // move them again): an invalidation published there reaches B.
            try await cluster.waitUntilAllSentinelsName(newMaster)
            let channel = h.configuration.store.keyPrefix + "invalidate"
            let subscribed = try await firstTime(2, within: .seconds(20)) {
                guard case .array(let parts)? = try? RedisCommand.send(["PUBSUB", "NUMSUB", channel], port: newMaster), parts.count == 2,
                      case .integer(let count) = parts[1] else { return 0 }
                return count
            }
            #expect(subscribed != nil, "both instances subscribe to \(channel) on the new master")
            #expect(try await onB.request("/x").status == 200, "B has the session (and caches it for an hour)")
            let admin = try #require(b.service.adminAddress?.port)
            func cacheHits() async throws -> Double {
                let metrics = try await onB.request("http://127.0.0.1:\(admin)/metrics").body
                let line = metrics.split(separator: "\n").first { $0.hasPrefix(#"sessiongate_session_cache_total{result="hit"}"#) }
                return line.flatMap { $0.split(separator: " ").last }.flatMap { Double($0) } ?? 0
            }
            // NUMSUB counts B's subscription when Redis took it; B flushes its cache when it reads
            // the confirmation, a moment later (once after the request above had cached the
            // session): wait until a request is answered from the cache.
            let cached = try await firstTime(1, within: .seconds(10)) {
                let hitsBefore = try await cacheHits()
                let status = try await onB.request("/x").status
                let hitsAfter = try await cacheHits()
                return status == 200 && hitsAfter == hitsBefore + 1 ? 1 : 0
            }
            #expect(cached != nil, "B answers from its cache: only the invalidation can make it refuse now")
            #expect(try await user.request("/_auth/logout", method: .POST, form: []).status == 303)
            let loggedOut = ContinuousClock.now
            let refused = try await firstTime(302, within: .seconds(5)) { try await onB.request("/x").status }
            #expect(refused != nil, "B still admits a session logged out on A after the failover: the invalidation did not reach it")
            if let refused { print("gateway behind sentinel: logout on A → refused on B within \(refused - loggedOut) after the failover") }

            // A new sign-in writes to the new master; both instances admit it.
            let newcomer = TestBrowser(gatewayOrigin: h.origin)
            _ = try await newcomer.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await newcomer.request("/x").status == 200)
            let newcomerOnB = TestBrowser(gatewayOrigin: b.origin)
            newcomerOnB.cookies = newcomer.cookies
            #expect(try await newcomerOnB.request("/x").status == 200)
        }
    }
}
