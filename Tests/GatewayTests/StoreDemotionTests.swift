import Foundation
import Gateway
import GatewayConfig
import TestSupport
import Testing

/// The gateway's Redis is demoted under it (a managed failover with the name not moved yet):
/// what the user and the operator see while it lasts, and that it ends without a restart.
@Suite("Gateway on a demoted Redis primary", .serialized, .timeLimit(.minutes(2)))
struct StoreDemotionTests {
    @Test("a demoted primary: logout answers 503 and ends nothing, store_up is 0, /readyz and the log name a read-only replica within seconds; promoted again, logout works without a restart")
    func demotion() async throws {
        let a = try RedisServerProcess()
        defer { a.stop() }
        let b = try RedisServerProcess(arguments: ["--replicaof", "127.0.0.1", String(a.port)])
        defer { b.stop() }
        try Poll.until(Date().addingTimeInterval(20), "the replica syncs") { RedisCommand.info(port: b.port)["master_link_status"] == "up" }
        let logs = LogRecorder()
        try await SignInHarness.with(store: .redis, redis: TestRedis(host: "127.0.0.1", port: a.port, database: 0, process: nil),
                                     localCacheTTL: .zero, logs: logs) { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await browser.request("/x").status == 200)
            let adminPort = try #require(h.service.adminAddress?.port)
            func admin(_ path: String) async throws -> (Int, String) {
                let answer = try await browser.request("http://127.0.0.1:\(adminPort)\(path)")
                return (answer.status, answer.body)
            }
            func storeUp() async throws -> String? {
                try await admin("/metrics").1.split(separator: "\n").first { $0.hasPrefix("sessiongate_store_up ") }.map { String($0.dropFirst("sessiongate_store_up ".count)) }
            }
            let up = try await storeUp()
            #expect(up == "1.0", "\(up ?? "no store_up")")

            // Demoted: B promoted, A its replica, the gateway still on A.
            _ = try RedisCommand.send(["REPLICAOF", "NO", "ONE"], port: b.port)
            _ = try RedisCommand.send(["REPLICAOF", "127.0.0.1", String(b.port)], port: a.port)
            let demoted = ContinuousClock.now
            try await Poll.within(.seconds(5), "the log names a read-only replica") {
                logs.all.contains { $0.contains("session store is a read-only replica") && $0.contains("fault=readOnly") }
            }
            let seen = ContinuousClock.now - demoted
            #expect(try await storeUp() == "0.0", "store_up")
            #expect(try await admin("/readyz") == (200, "ready; the session store is unreachable: guarded routes answer 503\n"), "/readyz")
            print("gateway on a demoted primary: the log and store_up said so \(seen) after the demotion")
            #expect(seen < .seconds(3), "within a second of the first failed write (the watcher writes every second)")

            let logout = try await browser.request("/_auth/logout", method: .POST, form: [])
            #expect(logout.status == 503, "a logout the store did not take is not answered as done: \(logout.status)")

            // Promoted again (the name never moved): the same connections' next dial reaches a master.
            _ = try RedisCommand.send(["REPLICAOF", "NO", "ONE"], port: a.port)
            let linesBefore = logs.all.count
            try await Poll.within(.seconds(10), "the log says the store is back") { logs.all.dropFirst(linesBefore).contains { $0.contains("session store reachable") } }
            #expect(try await storeUp() == "1.0")
            let after = try await browser.request("/x")
            #expect(after.status == 200, "the session survived the outage: \(after.status) \(after.body.prefix(200)) \(logs.all.suffix(8))")
            #expect(try await browser.request("/_auth/logout", method: .POST, form: []).status == 303, "logout works again")
            #expect(try await browser.request("/x").status == 302, "and ended the session")
        }
    }
}
