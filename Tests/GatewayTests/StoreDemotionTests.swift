import Foundation
import Gateway
import GatewayConfig
import TestSupport
import Testing

/// The gateway's Redis is demoted under it (a managed failover with the name not moved yet):
/// what the user and the operator see while it lasts, and that it ends without a restart.
@Suite("Gateway on a demoted Redis primary", .serialized, .timeLimit(.minutes(2)))
struct StoreDemotionTests {
    @Test("a full Redis (maxmemory, noeviction): store_up 0 and a log line saying it is full within seconds; given room, reachable again")
    func full() async throws {
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(localCacheTTL: .zero, logs: logs) { h, redis in
            #expect(try await h.metric("sessiongate_store_up") == "1.0")
            let before = logs.all.count
            _ = try RedisCommand.send(["CONFIG", "SET", "maxmemory-policy", "noeviction"], port: redis.port)
            _ = try RedisCommand.send(["CONFIG", "SET", "maxmemory", "1"], port: redis.port)
            try await Poll.within(.seconds(5), "the log says the store is full") {
                logs.all.dropFirst(before).contains { $0.contains("session store is full (maxmemory)") && $0.contains("fault=outOfMemory") }
            }
            #expect(try await h.metric("sessiongate_store_up") == "0.0", "a PING would still pass: the watcher's write does not")
            let full = logs.all.count
            _ = try RedisCommand.send(["CONFIG", "SET", "maxmemory", "0"], port: redis.port)
            try await Poll.within(.seconds(5), "the log says the store is back") { logs.all.dropFirst(full).contains { $0.contains("session store reachable") } }
            #expect(try await h.metric("sessiongate_store_up") == "1.0")
        }
    }

    @Test("a demoted primary: store_up is 0, /readyz and the log name a read-only replica within seconds, a logout is held and refused at once; promoted again, the logout is applied and logout works without a restart")
    func demotion() async throws {
        let pair = try await blocking { try RedisReplicatedPair() }  // seconds, off the cooperative pool
        defer { pair.stop() }
        let a = pair.primary
        let logs = LogRecorder()
        try await SignInHarness.with(store: .redis, redis: TestRedis(host: "127.0.0.1", port: a.port, database: 0, process: nil),
                                     localCacheTTL: .zero, logs: logs) { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await browser.request("/x").status == 200)
            let other = TestBrowser(gatewayOrigin: h.origin)
            _ = try await other.signIn(from: "/x", as: h.simulator.createUser())
            let stale = TestBrowser(gatewayOrigin: h.origin)
            stale.cookies = other.cookies
            #expect(try await stale.request("/x").status == 200)
            let up = try await h.metric("sessiongate_store_up")
            #expect(up == "1.0", "\(up ?? "no store_up")")

            // Demoted: B promoted, A its replica, the gateway still on A.
            try pair.failOver()
            let demoted = ContinuousClock.now
            try await Poll.within(.seconds(5), "the log names a read-only replica") {
                logs.all.contains { $0.contains("session store is a read-only replica") && $0.contains("fault=readOnly") }
            }
            let seen = ContinuousClock.now - demoted
            #expect(try await h.metric("sessiongate_store_up") == "0.0", "store_up")
            #expect(try await h.admin("/readyz") == (200, "ready; the session store is unreachable: guarded routes answer 503\n"), "/readyz")
            print("gateway on a demoted primary: the log and store_up said so \(seen) after the demotion")
            #expect(seen < .seconds(3), "within a second of the first failed write (the watcher writes every second)")

            // The other user's logout: the store refuses the write (READONLY), the logout is held.
            let logout = try await other.request("/_auth/logout", method: .POST, form: [])
            #expect(logout.status == 303, "a logout the store did not take is held, and done for the user: \(logout.status)")
            #expect(try await stale.request("/x").status == 302, "refused here at once")

            // Promoted again (the name never moved): the same connections' next dial reaches a master.
            _ = try RedisCommand.send(["REPLICAOF", "NO", "ONE"], port: a.port)
            let linesBefore = logs.all.count
            try await Poll.within(.seconds(10), "the log says the store is back") { logs.all.dropFirst(linesBefore).contains { $0.contains("session store reachable") } }
            #expect(try await h.metric("sessiongate_store_up") == "1.0")
            try await Poll.within(.seconds(5), "the held logout is applied") { logs.all.dropFirst(linesBefore).contains { $0.contains("a held revocation was applied") } }
            #expect(try await stale.request("/x").status == 302, "ended in the store, not only refused here")
            let after = try await browser.request("/x")
            #expect(after.status == 200, "the first user's session survived the outage: \(after.status) \(after.body.prefix(200)) \(logs.all.suffix(8))")
            #expect(try await browser.request("/_auth/logout", method: .POST, form: []).status == 303, "logout works again")
            #expect(try await browser.request("/x").status == 302, "and ended the session")
        }
    }
}
