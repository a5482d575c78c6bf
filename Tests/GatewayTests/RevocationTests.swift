import AppleIDSimulator
import Foundation
import Gateway
import NIOCore
import TestSupport
import Testing

/// Revocation across a fleet of two gateways sharing Redis (issue 5, first part): Apple's
/// notifications, the user's disconnect, logout — and the other instance refusing at once,
/// although its local cache would keep the session for an hour.
@Suite("Revocation across instances", .serialized, .timeLimit(.minutes(2)))
struct RevocationTests {
    /// Polls `request` until it answers `status`; the elapsed time.
    func timeUntil(_ status: Int, within limit: Duration = .seconds(5), _ request: () async throws -> Int) async throws -> Duration? {
        let start = ContinuousClock.now
        while ContinuousClock.now - start < limit {
            if try await request() == status { return ContinuousClock.now - start }
            try await Task.sleep(for: .milliseconds(2))
        }
        return nil
    }

    @Test("a consent-revoked notification to instance A: instance B refuses the user's next request")
    func notificationPropagates() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600)) { h in
            let b = try await h.addInstance()
            let sub = h.simulator.createUser()
            let browserA = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browserA.signIn(from: "/x", as: sub)
            let cookie = try #require(browserA.cookies["__Host-sessiongate"])
            let browserB = TestBrowser(gatewayOrigin: b.origin)
            browserB.cookies["__Host-sessiongate"] = cookie
            #expect(try await browserB.request("/x").status == 200, "the session works on B (and is now in B's cache)")
            #expect(try await browserB.request("/x").status == 200)

            let delivery = await h.simulator.sendNotification(.consentRevoked, sub: sub, to: h.origin + "/_auth/apple/notifications", retryDelays: [])
            #expect(delivery.status == 200)
            // A refused at once (its own cache was dropped before answering Apple); B through pub/sub.
            #expect(try await browserA.request("/x").status == 302)
            let delay = try await timeUntil(302) { try await browserB.request("/x").status }
            #expect(delay != nil, "B still admits the revoked user")
            if let delay { print("revocation propagation A → B observed within \(delay)") }

            // The same jti again is not processed again: a new session survives it.
            _ = try await browserA.signIn(from: "/x", as: sub)
            #expect(try await browserA.request("/x").status == 200)
            let again = await h.simulator.sendNotification(.consentRevoked, sub: sub, to: h.origin + "/_auth/apple/notifications", jti: delivery.jti, retryDelays: [])
            #expect(again.status == 200)
            #expect(try await browserA.request("/x").status == 200, "a redelivered notification is processed once")
        }
    }

    @Test("email-disabled updates X-Auth-Email-Forwarding on every instance; unknown users and bad payloads")
    func emailNotifications() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600)) { h in
            let b = try await h.addInstance()
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies = browser.cookies
            #expect(try await onB.request("/x").status == 200)
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-email-forwarding"].isEmpty)
            let delivery = await h.simulator.sendNotification(.emailDisabled, sub: sub, to: h.origin + "/_auth/apple/notifications", retryDelays: [])
            #expect(delivery.status == 200)
            let updated = try await timeUntil(1) {
                _ = try await onB.request("/x")
                return h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-email-forwarding"] == ["disabled"] ? 1 : 0
            }
            #expect(updated != nil, "B forwards the new state")
            // Unknown user: 200 (Apple must not retry); unverifiable: 400.
            let stranger = h.simulator.createUser()
            #expect(await h.simulator.sendNotification(.consentRevoked, sub: stranger, to: h.origin + "/_auth/apple/notifications", retryDelays: []).status == 200)
            let forged = try await browser.request("/_auth/apple/notifications", method: .POST, json: #"{"payload":"eyJhbGciOiJub25lIn0.e30."}"#)
            #expect(forged.status == 400)
            #expect(try await browser.request("/_auth/apple/notifications", method: .POST, json: "[]").status == 400)
            #expect(try await browser.request("/x").status == 200, "nothing above touched the user's session")
        }
    }

    @Test("the user disconnects: Apple's /auth/revoke for each refresh token, then every session ends everywhere")
    func userDisconnect() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600)) { h in
            let b = try await h.addInstance()
            let sub = h.simulator.createUser()
            let first = TestBrowser(gatewayOrigin: h.origin), second = TestBrowser(gatewayOrigin: h.origin)
            _ = try await first.signIn(from: "/x", as: sub)
            _ = try await second.signIn(from: "/x", as: sub)
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies = second.cookies
            #expect(try await onB.request("/x").status == 200)
            let revokesBefore = h.simulator.requestCount("/auth/revoke")
            let answer = try await first.request("/_auth/revoke", method: .POST, form: [])
            #expect(answer.status == 303 && answer.location == "/_auth/sign-in?message=disconnected")
            #expect(h.simulator.requestCount("/auth/revoke") - revokesBefore == 2, "one revoke per distinct refresh token (the latest is also kept per client: revoked once)")
            #expect(try await second.request("/x").status == 302)
            #expect(try await timeUntil(302) { try await onB.request("/x").status } != nil)
            #expect(try await first.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: []).status == 401)
        }
    }

    @Test("a disconnect Apple has not confirmed ends every session here and says where to stop it at Apple, not that Apple stopped")
    func unconfirmedDisconnect() async throws {
        try await SignInHarness.with { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin), other = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            _ = try await other.signIn(from: "/x", as: sub)
            h.simulator.setFaults { $0.revokeFailureStatus = 503 }
            let answer = try await browser.request("/_auth/revoke", method: .POST, form: [])
            #expect(answer.status == 303 && answer.location == "/_auth/sign-in?message=disconnected_here")
            #expect(try await other.request("/x").status == 302, "the user's sessions ended all the same")
            let page = try await browser.request(try #require(answer.location))
            #expect(page.body.contains("Apple has not confirmed") && page.body.contains("Sign in with Apple (or go to account.apple.com)"))
            #expect(!page.body.contains("no longer uses your Apple Account, and"))
        }
    }

    @Test("logout on A ends the session on B at once")
    func logoutPropagates() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600)) { h in
            let b = try await h.addInstance()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
            let onB = TestBrowser(gatewayOrigin: b.origin)
            onB.cookies = browser.cookies
            #expect(try await onB.request("/x").status == 200)
            #expect(try await browser.request("/_auth/logout", method: .POST, form: []).status == 303)
            #expect(try await timeUntil(302) { try await onB.request("/x").status } != nil)
        }
    }
}
