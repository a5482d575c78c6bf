import AppleIDSimulator
import Foundation
import TestSupport
import Testing

@testable import Gateway

/// Why a session ended, told to the app that presents it (issue 39 §6): the 401's `reason`,
/// `X-Sessiongate-Session-Ended`, and `error="invalid_token"` in `WWW-Authenticate` — the
/// server-side counterpart of `getCredentialState` on the device.
@Suite("A session that ended says why", .serialized, .timeLimit(.minutes(2)))
struct SessionEndReasonTests {
    /// A native sign-in: the app's bearer token.
    static func nativeToken(_ h: SignInHarness, _ sub: String) async throws -> String {
        let auth = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nil)
        let answer = try await TestBrowser(gatewayOrigin: h.origin).request("/_auth/native", method: .POST,
                                                                            json: #"{"identity_token":"\#(auth.identityToken)","authorization_code":"\#(auth.authorizationCode)"}"#)
        return try #require((try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])?["token"] as? String)
    }

    /// The app's next API call with `token`: the status and the reason it is given (JSON and header agreeing).
    static func call(_ h: SignInHarness, _ token: String, path: String = "/x") async throws -> (status: Int, reason: String?) {
        let r = try await TestBrowser(gatewayOrigin: h.origin).request(path, headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")], sendCookies: false)
        let json = (try? JSONSerialization.jsonObject(with: Data(r.body.utf8))) as? [String: Any]
        let header = r.headers.first(name: "x-sessiongate-session-ended")
        #expect(json?["reason"] as? String == header, "the JSON and the header agree: \(r.body)")
        if let header { #expect(r.headers.first(name: "www-authenticate")?.contains(#"error="invalid_token", error_description="\#(header)""#) == true) }
        return (r.status, header)
    }

    @Test("signed_out, revoked, deleted, expired — each as it happened, on the instance that did not end it too; no reason for a credential that never was a session",
          arguments: [SignInHarness.Store.memory, .redis])
    func reasons(store: SignInHarness.Store) async throws {
        try await SignInHarness.with(store: store, localCacheTTL: .seconds(3600), absoluteTimeout: .seconds(7200)) { h in
            let api = "/x"
            // Signed out: a logout with the token.
            let out = try await Self.nativeToken(h, h.simulator.createUser())
            #expect(try await Self.call(h, out).status == 200)
            #expect(try await TestBrowser(gatewayOrigin: h.origin).request("/_auth/logout", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(out)")], form: [], sendCookies: false).status == 204)
            #expect(try await Self.call(h, out) == (401, "signed_out"))
            #expect(try await Self.call(h, out, path: "/_auth/userinfo") == (401, "signed_out"))

            // Revoked: Apple's consent-revoked.
            let revokedSub = h.simulator.createUser()
            let revoked = try await Self.nativeToken(h, revokedSub)
            #expect(await h.simulator.sendNotification(.consentRevoked, sub: revokedSub, to: h.origin + "/_auth/apple/notifications", retryDelays: []).status == 200)
            #expect(try await Self.call(h, revoked, path: api) == (401, "revoked"))

            // Deleted: the user's own deletion, and Apple's.
            let deleted = try await Self.nativeToken(h, h.simulator.createUser())
            #expect(try await TestBrowser(gatewayOrigin: h.origin).request("/_auth/account/delete", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(deleted)")], sendCookies: false).status == 200)
            #expect(try await Self.call(h, deleted) == (401, "deleted"))
            let goneSub = h.simulator.createUser()
            let gone = try await Self.nativeToken(h, goneSub)
            #expect(await h.simulator.sendNotification(.accountDelete, sub: goneSub, to: h.origin + "/_auth/apple/notifications", retryDelays: []).status == 200)
            #expect(try await Self.call(h, gone) == (401, "deleted"))

            // Expired: past the absolute timeout (cached here; gone from the store elsewhere).
            let old = try await Self.nativeToken(h, h.simulator.createUser())
            #expect(try await Self.call(h, old).status == 200)
            h.clock.advance(by: .seconds(7201))
            #expect(try await Self.call(h, old) == (401, "expired"))

            // Never a session: a forged token, and none at all.
            #expect(try await Self.call(h, "forged.token") == (401, nil))
            let anonymous = try await TestBrowser(gatewayOrigin: h.origin).request(api, headers: [("accept", "application/json")])
            #expect(anonymous.status == 401 && anonymous.headers.first(name: "x-sessiongate-session-ended") == nil && !anonymous.body.contains("reason"))
        }
    }

    @Test("another instance, whose cache never held the session, reads why from the store")
    func fromTheStore() async throws {
        try await SignInHarness.with(store: .redis) { h in
            let b = try await h.addInstance()
            let token = try await Self.nativeToken(h, h.simulator.createUser())
            #expect(try await TestBrowser(gatewayOrigin: h.origin).request("/_auth/logout", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")], form: [], sendCookies: false).status == 204)
            let onB = try await TestBrowser(gatewayOrigin: b.origin).request("/x", headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")], sendCookies: false)
            #expect(onB.status == 401 && onB.headers.first(name: "x-sessiongate-session-ended") == "signed_out", "\(onB.body)")
            let check = try await TestBrowser(gatewayOrigin: b.origin).request("/_auth/check", headers: [("authorization", "Bearer \(token)")], sendCookies: false)
            #expect(check.status == 401 && check.headers.first(name: "x-sessiongate-session-ended") == "signed_out", "forward-auth passes it on too")
        }
    }
}

/// Apple's email claims as Apple sends them (issue 39 §8): a Managed Apple Account's email
/// (Sign in with Apple at Work & School) may be unverified, and an email allow list then does
/// not admit it, end to end through the simulator.
@Suite("An unverified Work & School email", .serialized, .timeLimit(.minutes(1)))
struct UnverifiedEmailTests {
    @Test("an email_verified false token signs in, says so to the app, and is not admitted by an email-domain allow list; a verified one of the same domain is")
    func unverifiedEmail() async throws {
        try await SignInHarness.with { h in
            let managed = h.simulator.createUser(email: "ada@example.org", privateEmail: false, emailVerified: false)
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: managed)
            #expect(try await browser.request("/x").status == 200)
            let info = try await browser.request("/_auth/userinfo", headers: [("accept", "application/json")])
            #expect(info.body.contains(#""email_verified":false"#), "\(info.body)")
            #expect(try await browser.request("/staff/x", headers: [("accept", "application/json")]).status == 403, "an unverified email is no member of example.org")
            let verified = TestBrowser(gatewayOrigin: h.origin)
            _ = try await verified.signIn(from: "/x", as: h.simulator.createUser(email: "bob@example.org", privateEmail: false))
            #expect(try await verified.request("/staff/x", headers: [("accept", "application/json")]).status == 200)
        }
    }
}

/// Consent is per app group (issue 39 §2): Apple's `consent-revoked` names the group's primary
/// App ID, and only that group's sessions and tokens end.
@Suite("Consent per app group", .serialized, .timeLimit(.minutes(1)))
struct AppGroupConsentTests {
    @Test("with two app groups, consent revoked for one ends its sessions and tokens only; the other group's live on; an account deletion ends both",
          arguments: [SignInHarness.Store.memory, .redis])
    func twoGroups(store: SignInHarness.Store) async throws {
        try await SignInHarness.with(store: store, configure: { c in
            c.apple?.appGroups = [[SignInHarness.appClient], [SignInHarness.webClient]]
        }) { h in
            let sub = h.simulator.createUser()
            let web = TestBrowser(gatewayOrigin: h.origin)
            _ = try await web.signIn(from: "/x", as: sub)
            let app = try await SessionEndReasonTests.nativeToken(h, sub)
            let url = h.origin + "/_auth/apple/notifications"
            let (store, loop) = (h.service.core.store, h.service.core.outbox.loop)
            #expect(try await store.refreshTokens(of: sub, on: loop).get().count == 2)

            #expect(await h.simulator.sendNotification(.consentRevoked, sub: sub, to: url, audience: SignInHarness.appClient, retryDelays: []).status == 200)
            #expect(try await SessionEndReasonTests.call(h, app) == (401, "revoked"), "the app's group ended")
            #expect(try await web.request("/x").status == 200, "the web group's session lives on")
            #expect(try await store.refreshTokens(of: sub, on: loop).get().keys.sorted() == [SignInHarness.webClient], "and its token")

            let again = try await SessionEndReasonTests.nativeToken(h, sub)
            #expect(await h.simulator.sendNotification(.consentRevoked, sub: sub, to: url, audience: SignInHarness.webClient, retryDelays: []).status == 200)
            #expect(try await web.request("/x").status == 302, "now the web group's")
            #expect(try await SessionEndReasonTests.call(h, again).status == 200, "the app's new consent lives on")

            #expect(await h.simulator.sendNotification(.accountDelete, sub: sub, to: url, audience: SignInHarness.webClient, retryDelays: []).status == 200)
            #expect(try await SessionEndReasonTests.call(h, again) == (401, "deleted"), "a deleted account ends every group")
        }
    }
}
