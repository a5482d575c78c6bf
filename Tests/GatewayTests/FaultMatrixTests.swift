import AppleIDSimulator
import Foundation
import Gateway
import GatewayConfig
import TestSupport
import Testing

/// The fault matrix (issue 37 §5; README "Failures and what you see"), one row per test, with
/// real processes: a redis-server killed, frozen, restarted with its data; Apple's token and key
/// endpoints failing, slow or throttling; the app slow or resetting. Each row checks what the
/// user is answered, what is kept (sessions, revocations) and what the operator sees (metric,
/// log, readiness). The rows elsewhere: a demoted primary (`StoreDemotionTests`), two gateways
/// and notifications during an outage (`HeldRevocationTests`), a key rotation during a key
/// outage (`KeyRotationOutageTests`), Apple down at re-validation (`RevalidationTests`).
@Suite("Fault matrix", .serialized, .timeLimit(.minutes(3)))
struct FaultMatrixTests {
    static let cookie = "__Host-sessiongate"

    @Test("Redis killed: guarded routes 503 + Retry-After with the cookie kept, public routes served, store_up 0 and the log within seconds, a logout held; restarted with its data, every session is back and the logout applied")
    func redisKilled() async throws {
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), localCacheTTL: .zero, logs: logs) { h, redis in
            let (stays, leaves) = (TestBrowser(gatewayOrigin: h.origin), TestBrowser(gatewayOrigin: h.origin))
            _ = try await stays.signIn(from: "/x", as: h.simulator.createUser())
            _ = try await leaves.signIn(from: "/x", as: h.simulator.createUser())
            let left = try #require(leaves.cookies[Self.cookie])
            _ = try RedisCommand.send(["SAVE"], port: redis.port)

            redis.crash()
            let killed = ContinuousClock.now
            let denied = try await stays.request("/x")
            #expect(denied.status == 503 && denied.headers.first(name: "retry-after") == "1", "\(denied.status) \(denied.headers)")
            #expect(!denied.headers["set-cookie"].contains { $0.contains(Self.cookie) }, "the cookie is kept")
            #expect(try await stays.request("/public/p").status == 200, "public routes need no store")
            try await Poll.within(.seconds(5), "the log says the store is unreachable") { logs.all.contains { $0.contains("session store unreachable") } }
            print("fault matrix: Redis killed → the log said so \(ContinuousClock.now - killed) later")
            #expect(try await h.metricLines("sessiongate_store_up ") == ["sessiongate_store_up 0.0"])
            #expect(try await h.admin("/readyz") == (200, "ready; the session store is unreachable: guarded routes answer 503\n"))
            #expect(try await leaves.request("/_auth/logout", method: .POST, form: []).status == 303, "a logout is held, not refused")

            try redis.start()
            try await Poll.within(.seconds(10), "the store is back and the logout applied") {
                logs.all.contains { $0.contains("session store reachable") } && logs.all.contains { $0.contains("a held revocation was applied") }
            }
            #expect(try await stays.request("/x").status == 200, "the session is back without signing in")
            let stale = TestBrowser(gatewayOrigin: h.origin)
            stale.cookies[Self.cookie] = left
            #expect(try await stale.request("/x").status == 302, "the logout held through the outage ended the session in the store")
            #expect(try await h.metricLines("sessiongate_store_up ") == ["sessiongate_store_up 1.0"])
        }
    }

    @Test("Redis frozen (SIGSTOP): a guarded request is 503 within store.timeout, not held until the client gives up; store_up 0 and the log name the timeout (fault=timeout); thawed, the same session is admitted")
    func redisFrozen() async throws {
        let logs = LogRecorder()
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), localCacheTTL: .zero, logs: logs) { h, redis in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            redis.freeze()
            let frozen = ContinuousClock.now
            let denied = try await browser.request("/x")
            let took = ContinuousClock.now - frozen
            #expect(denied.status == 503, "\(denied.status)")
            print("fault matrix: Redis frozen → 503 after \(took) (store.timeout 1 s)")
            #expect(took >= .milliseconds(900), "it waited for the store, up to store.timeout: \(took)")
            // By its kind: which of two equal deadlines (the store call's, the Redis command's) says so first varies.
            try await Poll.within(.seconds(5), "the log names the timeout") {
                logs.all.contains { $0.contains("session store unreachable") && $0.contains("fault=timeout") }
            }
            #expect(try await h.metricLines("sessiongate_store_up ") == ["sessiongate_store_up 0.0"])
            redis.thaw()
            try await Poll.within(.seconds(10), "the store is back") { logs.all.contains { $0.contains("session store reachable") } }
            #expect(try await browser.request("/x").status == 200)
        }
    }

    enum AppleFault: String, CaseIterable, Sendable {
        case unavailable = "Apple's token endpoint 503", throttled = "Apple's token endpoint 429", slow = "Apple's token endpoint slower than apple.timeout"
        func apply(_ f: inout SimulatedAppleID.Faults) {
            switch self {
            case .unavailable: f.tokenFailureStatus = 503
            case .throttled: f.tokenFailureStatus = 429
            case .slow: f.latencyMilliseconds = 2500
            }
        }
    }

    @Test("Apple failing at sign-in: the failure page (502 apple_unavailable) with Start again, counted; once Apple answers, the same browser signs in", arguments: AppleFault.allCases)
    func appleAtSignIn(_ fault: AppleFault) async throws {
        try await SignInHarness.with(configure: { $0.apple?.timeout = .seconds(1) }) { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            let sub = h.simulator.createUser()
            h.simulator.setFaults { fault.apply(&$0) }
            let (_, post) = try await browser.signIn(from: "/x", as: sub, stopBeforeCallback: true)
            let failed = try await browser.request(post.action, method: .POST, form: post.fields)
            #expect(failed.status == 502, "\(fault.rawValue): \(failed.status) \(TestBrowser.visibleText(failed.body).prefix(300))")
            #expect(failed.body.contains("Start again"), "\(fault.rawValue): says what to do")
            #expect(browser.cookies[Self.cookie] == nil, "no session")
            let counted = try await h.metricLines(#"sessiongate_sign_ins_total{flow="web",outcome="apple_unavailable"}"#)
            #expect(counted == [#"sessiongate_sign_ins_total{flow="web",outcome="apple_unavailable"} 1"#], "\(counted)")

            h.simulator.setFaults { $0 = SimulatedAppleID.Faults() }
            _ = try await browser.signIn(from: "/x", as: sub)
            #expect(try await browser.request("/x").status == 200)
        }
    }

    @Test("the app slow beyond upstream_response: 504; the app resetting mid-response: the client's connection cut; both counted by kind, and the session survives both")
    func appFailing() async throws {
        try await SignInHarness.with(configure: { $0.server.timeouts.upstreamResponse = .milliseconds(300) }) { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await browser.request("/slow?ms=3000").status == 504)
            await #expect(throws: (any Error).self, "a response cut short is not passed on as whole") {
                _ = try await browser.request("/reset")
            }
            let kinds = try await h.metricLines("sessiongate_upstream_errors_total{").filter { !$0.hasSuffix(" 0") }
            #expect(kinds.contains { $0.contains(#"kind="response_timeout""#) && $0.hasSuffix(" 1") }, "\(kinds)")
            #expect(kinds.contains { $0.contains(#"kind="reset_during_response""#) && $0.hasSuffix(" 1") }, "\(kinds)")
            #expect(try await browser.request("/x").status == 200, "an app failure ends no session")
        }
    }
}
