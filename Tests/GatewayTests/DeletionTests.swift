import AppleIDSimulator
import Foundation
import GatewayConfig
import Sessions
import TestSupport
import Testing

@testable import AppleIDSimulator
@testable import Gateway

/// Deletion compliance (issue 13 §3, issue 25 §2–3): a disconnect revokes at Apple every token
/// the user gave and keeps the account; a deletion keeps nothing but the revocation marker; late
/// notifications and old grants never undo newer state.
@Suite("Deletion and late notifications", .serialized, .timeLimit(.minutes(2)))
struct DeletionTests {
    /// Polls `request` until it answers `status`: whether it did within `limit`.
    func timeUntil(_ status: Int, within limit: Duration = .seconds(5), _ request: () async throws -> Int) async throws -> Bool {
        try await firstTime(status, within: limit, every: .milliseconds(5), request) != nil
    }

    static func tokens(of sub: String, at simulator: SimulatedAppleID) -> [(token: String, revoked: Bool)] {
        simulator.grants.withLockedValue { g in g.refreshTokens.filter { $0.value.sub == sub }.map { ($0.key, $0.value.revoked) } }
    }

    /// Two web sign-ins (one logged out since) and one native one.
    static func signInEverywhere(_ h: SignInHarness, _ sub: String) async throws -> TestBrowser {
        let old = TestBrowser(gatewayOrigin: h.origin)
        _ = try await old.signIn(from: "/x", as: sub)
        #expect(try await old.request("/_auth/logout", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
        let app = TestBrowser(gatewayOrigin: h.origin)
        let native = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nil)
        #expect(try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(native.identityToken)","authorization_code":"\#(native.authorizationCode)"}"#).status == 200)
        let web = TestBrowser(gatewayOrigin: h.origin)
        _ = try await web.signIn(from: "/x", as: sub)
        return web
    }

    @Test("the user disconnects: every token they gave is revoked at Apple; the profile stays (disconnecting is not deleting)", arguments: [SignInHarness.Store.memory, .redis])
    func disconnect(store: SignInHarness.Store) async throws {
        try await SignInHarness.with(store: store) { h in
            let sub = h.simulator.createUser(email: "ada@example.org", privateEmail: false)
            let web = try await Self.signInEverywhere(h, sub)
            #expect(Self.tokens(of: sub, at: h.simulator).count == 3)
            let revokes = h.simulator.requestCount("/auth/revoke")
            let loop = h.service.core.outbox.loop
            #expect(try await h.service.core.store.profile(of: sub, on: loop).get() != nil)
            let answer = try await web.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: [])
            #expect(answer.status == 204)
            let tokens = Self.tokens(of: sub, at: h.simulator)
            // One call per client's latest token (web, app): Apple's revocation ends the user's whole
            // authorization, the logged-out session's older token with it.
            #expect(h.simulator.requestCount("/auth/revoke") - revokes == 2)
            #expect(tokens.count == 3 && tokens.allSatisfy { $0.revoked }, "\(tokens)")
            #expect(try await h.service.core.store.profile(of: sub, on: loop).get()?.email == "ada@example.org", "the profile stays")
            #expect(try await h.service.core.store.refreshTokens(of: sub, on: loop).get().isEmpty)
            #expect(try await h.service.core.store.jobs(on: loop).get().isEmpty, "nothing left to retry")
        }
    }

    @Test("a native app deletes its user's account in one call: every token revoked at Apple; profile, tokens, link and every session gone on every instance; the app hears user.deleted; a returning user is a new account")
    func accountDeleteFromTheApp() async throws {
        setenv("SG_TEST_LINKS_SECRET", LinkingTests.secret, 1)
        try await EventReceiver.with { receiver in
            try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600), assertion: true, configure: { c in
                c.events.url = receiver.url
                c.identity.linksSecretFile = SecretReference.parse("env:SG_TEST_LINKS_SECRET")
            }) { h in
                let b = try await h.addInstance()
                let sub = h.simulator.createUser(email: "ada@example.org", privateEmail: false)
                let web = try await Self.signInEverywhere(h, sub)
                let onB = TestBrowser(gatewayOrigin: b.origin)
                onB.cookies = web.cookies
                #expect(try await onB.request("/x").status == 200, "in B's cache now")
                #expect(try await LinkingTests.post(web, #"{"sub":"\#(sub)","account":"acct-7"}"#).status == 200)
                let native = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nil)
                let app = TestBrowser(gatewayOrigin: h.origin)
                let signedIn = try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(native.identityToken)","authorization_code":"\#(native.authorizationCode)"}"#)
                let bearer = try #require((try JSONSerialization.jsonObject(with: Data(signedIn.body.utf8)) as? [String: Any])?["token"] as? String)
                let revokes = h.simulator.requestCount("/auth/revoke")

                let answer = try await app.request("/_auth/account/delete", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(bearer)")], sendCookies: false)
                #expect(answer.status == 200 && answer.body == #"{"apple_revoked":true,"deleted":true}"#, "\(answer.status) \(answer.body)")
                #expect(h.simulator.requestCount("/auth/revoke") - revokes == 3, "one call per live refresh token: the web session's and both app sessions'")
                #expect(Self.tokens(of: sub, at: h.simulator).allSatisfy { $0.revoked })
                let (store, loop) = (h.service.core.store, h.service.core.outbox.loop)
                #expect(try await store.profile(of: sub, on: loop).get() == nil, "the name and email are gone")
                #expect(try await store.refreshTokens(of: sub, on: loop).get().isEmpty)
                #expect(try await store.account(linkedTo: sub, on: loop).get() == nil, "the link is gone")
                #expect(try await web.request("/x").status == 302)
                #expect(try await timeUntil(302) { try await onB.request("/x").status }, "B dropped the user at once")
                let event = try await AppEventsTests.verified(try #require(await receiver.waitFor(2).first { $0.type == "user.deleted" }), gateway: web)
                #expect(event["type"] as? String == "user.deleted" && event["sub"] as? String == sub && event["reason"] as? String == "user_request", "\(event)")
                #expect(try await app.request("/_auth/account/delete", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(bearer)")], sendCookies: false).status == 401)

                let again = TestBrowser(gatewayOrigin: h.origin)
                _ = try await again.signIn(from: "/x", as: sub)
                #expect(try await again.request("/x").status == 200, "signing in again is a new account")
                #expect(try await store.account(linkedTo: sub, on: loop).get() == nil)
            }
        }
    }

    @Test("a browser deletes its account from a confirmation page: GET asks, a cross-origin POST is refused, the POST deletes and says whether Apple confirmed")
    func accountDeleteFromABrowser() async throws {
        try await SignInHarness.with(store: .memory) { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            let page = try await browser.request("/_auth/account/delete")
            #expect(page.status == 200 && page.body.contains("Delete your account?"))
            #expect(TestBrowser.form(in: page.body).action == "/_auth/account/delete")
            #expect(page.headers.first(name: "referrer-policy") == "same-origin", "its POST carries the page's Origin, not null")
            let foreign = try await browser.request("/_auth/account/delete", method: .POST, headers: [("accept", "text/html"), ("origin", "https://evil.example.org")], form: [])
            #expect(foreign.status == 403)
            #expect(try await browser.request("/x").status == 200, "nothing was deleted")
            let answer = try await browser.request("/_auth/account/delete", method: .POST, headers: [("accept", "text/html"), ("origin", h.origin)], form: [])
            #expect(answer.status == 303 && answer.location == "/_auth/sign-in?message=deleted", "\(answer.status) \(answer.location ?? "-")")
            #expect(browser.cookies["__Host-sessiongate"] == nil, "the session cookie is cleared")
            #expect(try await browser.request(try #require(answer.location)).body.contains("Your account has been deleted"))
            #expect(try await h.service.core.store.profile(of: sub, on: h.service.core.outbox.loop).get() == nil)

            // Apple not confirming: deleted here, and told where to stop it at Apple.
            let other = h.simulator.createUser()
            _ = try await browser.signIn(from: "/x", as: other)
            h.simulator.setFaults { $0.revokeFailureStatus = 503 }
            let unconfirmed = try await browser.request("/_auth/account/delete", method: .POST, form: [])
            #expect(unconfirmed.location == "/_auth/sign-in?message=deleted_here")
            #expect(try await browser.request(try #require(unconfirmed.location)).body.contains("Apple has not confirmed"))
            #expect(try await browser.request("/_auth/account/delete", method: .POST, headers: [("accept", "application/json")], form: []).status == 401)
        }
    }

    @Test("Apple down during the deletion: the user is revoked here at once; the outbox revokes the tokens when Apple is back")
    func outboxRetries() async throws {
        try await SignInHarness.with(store: .redis) { h in
            let sub = h.simulator.createUser()
            let web = try await Self.signInEverywhere(h, sub)
            // The test drives the outbox's passes itself: its timer would race them.
            h.service.core.outbox.stop()
            h.clock.freeze()  // "not due yet" must not depend on how long the requests take
            h.simulator.setFaults { $0.revokeFailureStatus = 503 }
            #expect(try await web.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
            #expect(try await web.request("/x").status == 302, "revoked here whatever Apple said")
            let outbox = h.service.core.outbox
            let pending = try await h.service.core.store.jobs(on: outbox.loop).get()
            #expect(pending.count == 2 && pending.allSatisfy { $0.kind == .appleRevoke && $0.attempts == 1 }, "one per client: \(pending)")
            #expect(Self.tokens(of: sub, at: h.simulator).allSatisfy { !$0.revoked })
            // Not due yet: a pass does nothing.
            #expect(await outbox.runDue().isEmpty)
            h.simulator.setFaults { $0.revokeFailureStatus = nil }
            h.clock.advance(by: .seconds(6))  // past the first backoff (5 s)
            #expect(await outbox.runDue().count == 2)
            #expect(Self.tokens(of: sub, at: h.simulator).allSatisfy { $0.revoked })
            #expect(try await h.service.core.store.jobs(on: outbox.loop).get().isEmpty)
        }
    }

    @Test("a queued revocation this gateway's key cannot open is dropped, not retried forever")
    func unopenableRevocationDropped() async throws {
        try await SignInHarness.with(store: .memory) { h in
            let outbox = h.service.core.outbox
            outbox.stop()
            let store = h.service.core.store
            let foreign = AppleRevocation(clientID: SignInHarness.webClient, context: SessionKeys.userContext("001.x"), sealedToken: "c2VhbGVkLWVsc2V3aGVyZQ")
            let t = h.clock.now()
            try await store.putJob(OutboxJob(id: foreign.jobID, kind: .appleRevoke, payload: foreign.payload, nextAttempt: t, created: t), on: outbox.loop).get()
            let revokes = h.simulator.requestCount("/auth/revoke")
            #expect(await outbox.runDue().isEmpty, "not done")
            #expect(try await store.jobs(on: outbox.loop).get().isEmpty, "dropped")
            #expect(h.simulator.requestCount("/auth/revoke") == revokes, "Apple was not called")
        }
    }

    @Test("Apple's account-delete forgets the user whatever its event_time: a deleted account never signs in again")
    func accountDeleteIgnoresSkew() async throws {
        try await SignInHarness.with(store: .redis) { h in
            let sub = h.simulator.createUser(email: "ada@example.org", privateEmail: false)
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            // Apple's clock 10 minutes behind ours: its event_time predates the session.
            let skewed = h.clock.now() / 1000 - 600
            let delivery = await h.simulator.sendNotification(.accountDelete, sub: sub, to: h.origin + "/_auth/apple/notifications", eventTime: skewed, retryDelays: [])
            #expect(delivery.status == 200)
            #expect(try await browser.request("/x").status == 302, "every session ended")
            let loop = h.service.core.outbox.loop
            #expect(try await h.service.core.store.profile(of: sub, on: loop).get() == nil, "forgotten")
            #expect(try await h.service.core.store.refreshTokens(of: sub, on: loop).get().isEmpty)
        }
    }

    @Test("Apple refuses a queued revocation for good (a token of another client): given up, not retried hourly forever")
    func permanentRevokeRefusalDropped() async throws {
        try await SignInHarness.with(store: .memory) { h in
            let outbox = h.service.core.outbox
            outbox.stop()
            let sub = h.simulator.createUser()
            let native = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nil)
            let app = TestBrowser(gatewayOrigin: h.origin)
            #expect(try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(native.identityToken)","authorization_code":"\#(native.authorizationCode)"}"#).status == 200)
            let store = h.service.core.store
            let sealed = try #require(try await store.refreshTokens(of: sub, on: outbox.loop).get()[SignInHarness.appClient])
            // The app's token queued under the web client: Apple answers invalid_grant.
            let job = AppleRevocation(clientID: SignInHarness.webClient, context: SessionKeys.userContext(sub), sealedToken: sealed)
            let t = h.clock.now()
            try await store.putJob(OutboxJob(id: job.jobID, kind: .appleRevoke, payload: job.payload, nextAttempt: t, created: t), on: outbox.loop).get()
            let revokes = h.simulator.requestCount("/auth/revoke")
            #expect(await outbox.runDue().isEmpty, "not done")
            #expect(h.simulator.requestCount("/auth/revoke") == revokes + 1, "Apple was asked once")
            #expect(try await store.jobs(on: outbox.loop).get().isEmpty, "given up: the sealed token is gone with the job")
            let admin = try #require(h.service.adminAddress?.port)
            let metrics = try await app.request("http://127.0.0.1:\(admin)/metrics").body
            #expect(metrics.contains(#"sessiongate_outbox_attempts_total{kind="apple_revoke",result="dropped"} 1"#), "an operator can alert on it")
        }
    }

    @Test("a late consent-revoked keeps what a newer consent brought, though its session has ended: the new token stays")
    func lateNotificationAfterTheNewSessionEnded() async throws {
        try await SignInHarness.with(store: .redis) { h in
            let sub = h.simulator.createUser()
            let before = TestBrowser(gatewayOrigin: h.origin)
            _ = try await before.signIn(from: "/x", as: sub)
            let eventTime = h.clock.now() / 1000 + 30
            h.clock.advance(by: .seconds(60))
            let after = TestBrowser(gatewayOrigin: h.origin)
            _ = try await after.signIn(from: "/x", as: sub)
            #expect(try await after.request("/_auth/logout", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
            let loop = h.service.core.outbox.loop
            let newToken = try await h.service.core.store.refreshTokens(of: sub, on: loop).get()
            #expect(newToken.count == 1)
            let delivery = await h.simulator.sendNotification(.consentRevoked, sub: sub, to: h.origin + "/_auth/apple/notifications",
                                                              eventTime: eventTime, retryDelays: [])
            #expect(delivery.status == 200)
            #expect(try await before.request("/x").status == 302)
            #expect(try await h.service.core.store.refreshTokens(of: sub, on: loop).get() == newToken, "granted after the event: kept for a deletion to revoke")
        }
    }

    @Test("a consent-revoked delivered after the user signed in again ends only the sessions from before it")
    func lateNotification() async throws {
        try await SignInHarness.with(store: .redis) { h in
            let sub = h.simulator.createUser()
            let before = TestBrowser(gatewayOrigin: h.origin)
            _ = try await before.signIn(from: "/x", as: sub)
            let eventTime = h.clock.now() / 1000 + 30  // the user revoked consent 30 s after this sign-in
            h.clock.advance(by: .seconds(60))
            let after = TestBrowser(gatewayOrigin: h.origin)
            _ = try await after.signIn(from: "/x", as: sub)  // … and signed in again 30 s later
            let delivery = await h.simulator.sendNotification(.consentRevoked, sub: sub, to: h.origin + "/_auth/apple/notifications",
                                                              eventTime: eventTime, retryDelays: [])
            #expect(delivery.status == 200)
            #expect(try await before.request("/x").status == 302, "created before the event: ended")
            #expect(try await after.request("/x").status == 200, "created after it: kept")
        }
    }

    @Test("the logs name a user by sub only: no email, name, token or cookie at any level, through sign-in, notifications and a disconnect")
    func logsHoldNoPersonalDataButTheSub() async throws {
        let logs = LogRecorder()
        try await SignInHarness.with(store: .redis, logs: logs) { h in
            let sub = h.simulator.createUser(email: "ada.lovelace@example.org", privateEmail: false, firstName: "Augusta", lastName: "Byron")
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            let cookie = try #require(browser.cookies["__Host-sessiongate"] ?? browser.cookies.values.first)
            let url = h.origin + "/_auth/apple/notifications"
            // Apple sends email events only for relay addresses; this one carries the real email,
            // the one that must never reach a log line.
            h.simulator.setFaults { $0.emailEventsForSharedEmail = true }
            #expect(await h.simulator.sendNotification(.emailDisabled, sub: sub, to: url, retryDelays: []).status == 200)
            h.simulator.revokeConsent(sub: sub)  // Apple refuses the token at the next validation
            #expect(try await browser.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
            let tokens = Self.tokens(of: sub, at: h.simulator).map(\.token)
            let lines = logs.all
            #expect(lines.contains { $0.contains(sub) }, "the sub is logged (at info: revocations), for audit")
            for secret in ["ada.lovelace", "Augusta", "Byron", cookie] + tokens {
                #expect(!lines.contains { $0.contains(secret) }, "never logged: \(secret.prefix(6))…")
            }
        }
    }

    @Test("email notifications apply in event order: an older one arriving late is ignored")
    func emailOrdering() async throws {
        try await SignInHarness.with(store: .memory) { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            let url = h.origin + "/_auth/apple/notifications"
            let now = Int64(Date().timeIntervalSince1970)
            #expect(await h.simulator.sendNotification(.emailDisabled, sub: sub, to: url, eventTime: now, retryDelays: []).status == 200)
            #expect(await h.simulator.sendNotification(.emailEnabled, sub: sub, to: url, eventTime: now - 100, retryDelays: []).status == 200)
            let info = try await browser.request("/_auth/userinfo", headers: [("accept", "application/json")])
            #expect(info.body.contains(#""email_forwarding":"disabled""#), "the newer event stands: \(info.body)")
            #expect(await h.simulator.sendNotification(.emailEnabled, sub: sub, to: url, eventTime: now + 1, retryDelays: []).status == 200)
            #expect(try await browser.request("/_auth/userinfo", headers: [("accept", "application/json")]).body.contains(#""email_forwarding":"enabled""#))
        }
    }
}
