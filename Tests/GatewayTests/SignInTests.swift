import AppleIDSimulator
import AsyncHTTPClient
import Crypto
import Foundation
import Gateway
import HTTPProxy
import Redis
import NIOHTTP1
import NIOPosix
import Logging
import TestSupport
import Testing

enum StoreChoice: String, CaseIterable, CustomTestStringConvertible {
    case memory, redis
    var testDescription: String { rawValue }
    var store: SignInHarness.Store { self == .memory ? .memory : .redis }
}

@Suite("Sign-in and admission end to end", .serialized, .timeLimit(.minutes(2)))
struct SignInTests {
    @Test("web sign-in: first and later logins, identity headers, spoofing, logout", arguments: StoreChoice.allCases)
    func webSignIn(store: StoreChoice) async throws {
        try await SignInHarness.with(store: store.store) { h in
            let sub = h.simulator.createUser(privateEmail: false, firstName: "Zoë", lastName: "Ålander")
            let browser = TestBrowser(gatewayOrigin: h.origin)

            let (callback, post) = try await browser.signIn(from: "/dashboard?tab=1", as: sub)
            #expect(post.fields.contains { $0.0 == "user" }, "Apple sends the user JSON on the first authorization")
            #expect(callback?.status == 303)
            #expect(callback?.location == "/dashboard?tab=1")
            let loginCookie = try #require(browser.setCookies.first { $0.hasPrefix("__Host-sessiongate-login=") && !$0.contains("Max-Age=0") })
            #expect(loginCookie.contains("SameSite=None") && loginCookie.contains("Secure") && loginCookie.contains("HttpOnly"))
            let sessionCookie = try #require(browser.setCookies.last { $0.hasPrefix("__Host-sessiongate=") })
            for attribute in ["Path=/", "Secure", "HttpOnly", "SameSite=Lax"] { #expect(sessionCookie.contains(attribute), "\(attribute)") }
            #expect(browser.cookies["__Host-sessiongate-login"] == nil, "the pre-auth cookie is cleared")

            // Identity reaches the upstream; spoofed identity headers in any spelling never do; the
            // gateway's cookies are removed from the upstream's Cookie header.
            browser.cookies["theme"] = "dark"
            let page = try await browser.request("/dashboard?tab=1", headers: [
                ("accept", "text/html"), ("X-Auth-User", "evil"), ("x_auth_user", "evil2"), ("X-AUTH-EMAIL", "evil@example.com"),
                ("X-Auth-Name", "Mallory"), ("x-auth-assertion", "forged"), ("Connection", "X-Auth-Email-Verified"), ("X-Auth-Email-Verified", "true"),
            ])
            #expect(page.status == 200)
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(seen["x-auth-user"] == [sub])
            #expect(seen["x-auth-email"] == ["user@example.org"])
            #expect(seen["x-auth-email-verified"] == ["true"])
            #expect(seen["x-auth-name"] == ["Zo%C3%AB%20%C3%85lander"])
            #expect(seen["x_auth_user"].isEmpty && seen["x-auth-assertion"].isEmpty)
            #expect(seen["cookie"] == ["theme=dark"])

            // Allow list by verified email domain; the JSON view of the identity.
            #expect(try await browser.request("/staff/report").status == 200)
            let info = try await browser.request("/_auth/userinfo", headers: [("accept", "application/json")])
            #expect(info.status == 200 && info.body.contains("\"sub\":\"\(sub)\"") && info.body.contains("Zoë Ålander"))
            let check = try await browser.request("/_auth/check")
            #expect(check.status == 200 && check.headers["x-auth-user"] == [sub])

            // Logout ends the session and clears the cookie.
            let cookieBefore = try #require(browser.cookies["__Host-sessiongate"])
            #expect(try await browser.request("/_auth/logout").body.contains("Sign out?"))
            let logout = try await browser.request("/_auth/logout", method: .POST, form: [])
            #expect(logout.status == 303 && logout.location == "/_auth/sign-in?message=signed_out")
            #expect(browser.cookies["__Host-sessiongate"] == nil)
            browser.cookies["__Host-sessiongate"] = cookieBefore
            #expect(try await browser.request("/api/me").status == 401, "the old cookie is dead after logout")
            browser.cookies["__Host-sessiongate"] = nil

            // A later login: Apple sends no name, the gateway still forwards the stored one.
            let (again, post2) = try await browser.signIn(from: "/home", as: sub)
            #expect(!post2.fields.contains { $0.0 == "user" })
            #expect(again?.status == 303)
            #expect(try await browser.request("/home").status == 200)
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-name"] == ["Zo%C3%AB%20%C3%85lander"])
            #expect(browser.cookies["__Host-sessiongate"] != cookieBefore, "a new login issues a new session id")
        }
    }

    @Test("other proxies' identity headers and identity.strip_headers never reach the app, signed in or not, on every kind of route")
    func foreignIdentityHeaders() async throws {
        try await SignInHarness.with(configure: { $0.identity.stripHeaders = ["X-Legacy-User"] }) { h in
            let sub = h.simulator.createUser()
            let signedIn = TestBrowser(gatewayOrigin: h.origin)
            _ = try await signedIn.signIn(from: "/dashboard", as: sub)
            let anonymous = TestBrowser(gatewayOrigin: h.origin)
            let spoofs = [("Remote-User", "admin"), ("remote_user", "admin"), ("Remote-Groups", "admin"), ("X-Remote-User", "admin"),
                          ("X-WEBAUTH-USER", "admin"), ("X-Legacy-User", "admin"), ("x_legacy_user", "admin")]
            for (path, browser, who) in [("/dashboard", signedIn, "signed in"), ("/maybe/x", signedIn, "signed in"), ("/public/x", signedIn, "signed in"),
                                         ("/maybe/x", anonymous, "anonymous"), ("/public/x", anonymous, "anonymous")] {
                let response = try await browser.request(path, headers: [("accept", "text/html"), ("X-Legacy-Users", "kept")] + spoofs)
                #expect(response.status == 200, "\(path), \(who)")
                let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
                #expect(!seen.contains { $0.value == "admin" }, "\(path), \(who): \(seen.filter { $0.value == "admin" }.map(\.name))")
                #expect(seen["X-Legacy-Users"] == ["kept"], "\(path), \(who): only the names listed are removed")
                #expect(seen["X-Auth-User"] == (who == "signed in" && path != "/public/x" ? [sub] : []), "\(path), \(who)")
            }
        }
    }

    @Test("native sign-in and bearer access")
    func nativeSignIn() async throws {
        try await SignInHarness.with { h in
            let sub = h.simulator.createUser()
            let app = TestBrowser(gatewayOrigin: h.origin)
            let credential = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: "nonce-1")
            let body = #"{"identity_token":"\#(credential.identityToken)","authorization_code":"\#(credential.authorizationCode)","nonce":"nonce-1","user":{"name":{"firstName":"Ada","lastName":"Lovelace"}}}"#
            let response = try await app.request("/_auth/native", method: .POST, headers: [("accept", "application/json")], json: body)
            #expect(response.status == 200, "\(response.body)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(response.body.utf8)) as? [String: Any])
            let token = try #require(object["token"] as? String)
            #expect((object["expires_at"] as? String)?.hasSuffix("Z") == true)
            #expect((object["user"] as? [String: Any])?["name"] as? String == "Ada Lovelace")
            #expect(response.headers["set-cookie"].contains { $0.hasPrefix("__Host-sessiongate=\(token);") })

            let api = TestBrowser(gatewayOrigin: h.origin)
            let call = try await api.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")])
            #expect(call.status == 200)
            let seen = h.upstream.stats.withLockedValue { $0.lastHeaders }
            #expect(seen["x-auth-user"] == [sub] && seen["x-auth-name"] == ["Ada%20Lovelace"])
            #expect(seen["authorization"].isEmpty, "the session's bearer token never reaches the app")

            // Logout with the bearer token: 204, and the token is dead.
            let userinfo = try await api.request("/_auth/userinfo", headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")])
            #expect(userinfo.status == 200 && userinfo.body.contains("Ada Lovelace"))

            // The code is single use; a wrong nonce, garbage and missing fields are refused.
            let replay = try await app.request("/_auth/native", method: .POST, headers: [("accept", "application/json")], json: body)
            #expect(replay.status == 400 && replay.body.contains(#""error":"invalid_grant""#), "\(replay.body)")
            let other = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: "nonce-2")
            let wrongNonce = try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(other.identityToken)","authorization_code":"\#(other.authorizationCode)","nonce":"nonce-3"}"#)
            #expect(wrongNonce.status == 401 && wrongNonce.body.contains("invalid_identity_token"))
            #expect(try await app.request("/_auth/native", method: .POST, json: "not json").status == 400)
            #expect(try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"x"}"#).status == 400)
            #expect(try await api.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer forged")]).status == 401)
            let logout = try await api.request("/_auth/logout", method: .POST, headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")])
            #expect(logout.status == 204)
            #expect(try await api.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")]).status == 401)
        }
    }

    @Test("a user who moves from Apple's relay to their real address loses X-Auth-Private-Email: Apple omits the claim for a shared address")
    func sharedAddressIsNotPrivate() async throws {
        try await SignInHarness.with { h in
            let sub = h.simulator.createUser(privateEmail: true)
            func signInAndCall(nonce: String) async throws -> HTTPHeaders {
                let app = TestBrowser(gatewayOrigin: h.origin)
                let credential = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nonce)
                let body = #"{"identity_token":"\#(credential.identityToken)","authorization_code":"\#(credential.authorizationCode)","nonce":"\#(nonce)"}"#
                let response = try await app.request("/_auth/native", method: .POST, headers: [("accept", "application/json")], json: body)
                #expect(response.status == 200, "\(response.body)")
                let object = try #require(try JSONSerialization.jsonObject(with: Data(response.body.utf8)) as? [String: Any])
                let token = try #require(object["token"] as? String)
                let call = try await app.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")])
                #expect(call.status == 200)
                return h.upstream.stats.withLockedValue { $0.lastHeaders }
            }
            let relayed = try await signInAndCall(nonce: "nonce-relay")
            #expect(relayed["x-auth-private-email"] == ["true"])
            #expect(relayed["x-auth-email"].first?.hasSuffix("privaterelay.appleid.com") == true)
            // The user stops using the app and signs in again sharing their real address: Apple's
            // token names it and carries no is_private_email.
            h.simulator.createUser(email: "jane@example.org", privateEmail: false, sub: sub)
            let shared = try await signInAndCall(nonce: "nonce-shared")
            #expect(shared["x-auth-email"] == ["jane%40example.org"] || shared["x-auth-email"] == ["jane@example.org"])
            #expect(shared["x-auth-private-email"] == ["false"], "the relay's flag outlived the relay address: \(shared)")
        }
    }

    @Test("unauthenticated requests: redirect for browsers, 401 for APIs, public and optional routes, forged and doubled cookies")
    func unauthenticated() async throws {
        try await SignInHarness.with { h in
            let b = TestBrowser(gatewayOrigin: h.origin)
            let page = try await b.request("/reports/q3?year=2026")
            #expect(page.status == 302 && page.location == "/_auth/sign-in?rd=%2Freports%2Fq3%3Fyear%3D2026")
            let api = try await b.request("/api/x", headers: [("accept", "application/json")])
            #expect(api.status == 401 && api.body.contains("unauthenticated"))
            #expect(try await b.request("/api/x").status == 401, "unauthenticated: deny answers 401 even to browsers")
            #expect(try await b.request("/reports", method: .POST, form: []).status == 401, "only GET/HEAD HTML requests are redirected")
            #expect(try await b.request("/public/a", headers: [("X-Auth-User", "evil")]).status == 200)
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-user"].isEmpty)
            #expect(try await b.request("/maybe/a").status == 200, "optional routes forward anonymous requests")
            let before = h.upstream.stats.withLockedValue { $0.requests }
            let keys = try Sessions_forgedCookie()
            for cookie in [keys, String(repeating: "A", count: 86), "short", ""] {
                b.cookies = ["__Host-sessiongate": cookie]
                #expect(try await b.request("/reports").status == 302, "forged cookie \(cookie.prefix(8))")
            }
            #expect(h.upstream.stats.withLockedValue { $0.requests } == before, "nothing forged reaches the upstream")

            // A real session, but its cookie sent twice: unauthenticated.
            let sub = h.simulator.createUser()
            let user = TestBrowser(gatewayOrigin: h.origin)
            _ = try await user.signIn(from: "/x", as: sub)
            let cookie = try #require(user.cookies["__Host-sessiongate"])
            user.cookies = [:]
            let doubled = try await user.request("/x", headers: [("accept", "text/html"), ("cookie", "__Host-sessiongate=\(cookie); __Host-sessiongate=\(cookie)")])
            #expect(doubled.status == 302)
            let single = try await user.request("/x", headers: [("accept", "text/html"), ("cookie", "__Host-sessiongate=\(cookie)")])
            #expect(single.status == 200)
            #expect(try await user.request("/_auth/check", headers: [("cookie", "__Host-sessiongate=\(cookie)x")]).status == 401)
        }
    }

    @Test("open-redirect attempts land on /")
    func openRedirects() async throws {
        try await SignInHarness.with { h in
            let b = TestBrowser(gatewayOrigin: h.origin)
            let hostile = ["//evil.com", "/\\evil.com", "/%09/evil.com", "/./\\evil.com", "https://evil.com/", "https://docs.example.com@evil.com/",
                           "javascript:alert(1)", "http://docs.example.com/", "/%2f%2fevil.com", "https://evil.com\\@docs.example.com", "\\\\evil.com",
                           "/.//evil.com", "https://example.net/", "//docs.example.com", "/\n/evil.com"]
            for rd in hostile {
                let page = try await b.request("/_auth/sign-in?rd=\(FormBody.escape(rd))")
                #expect(page.body.contains("href=\"/_auth/login?rd=%2F\""), "\(rd)")
            }
            let allowed = ["/reports?x=1", "\(h.origin)/reports", "https://docs.example.com/guide", "https://a.example.net/x"]
            let expected = ["/reports?x=1", "/reports", "https://docs.example.com/guide", "https://a.example.net/x"]
            for (rd, want) in zip(allowed, expected) {
                let page = try await b.request("/_auth/sign-in?rd=\(FormBody.escape(rd))")
                #expect(page.body.contains("href=\"/_auth/login?rd=\(AuthTestHTML.escape(FormBody.escape(want)))\""), "\(rd)")
            }
        }
    }

    @Test("callback: replayed, without the pre-auth cookie, forged state, another browser's login, cancel, session fixation")
    func callbackAttacks() async throws {
        try await SignInHarness.with { h in
            let sub = h.simulator.createUser()

            // An old browser that reads SameSite=None as Strict drops the pre-auth cookie on
            // Apple's cross-site POST, but sends its twin without SameSite: signed in.
            let old = TestBrowser(gatewayOrigin: h.origin)
            let (_, oldPost) = try await old.signIn(from: "/x", as: sub, stopBeforeCallback: true)
            #expect(old.cookies["__Host-sessiongate-login-legacy"] == old.cookies["__Host-sessiongate-login"])
            #expect(old.setCookies.contains { $0.hasPrefix("__Host-sessiongate-login-legacy=") && !$0.contains("SameSite") })
            old.cookies["__Host-sessiongate-login"] = nil
            let legacy = try await old.request(oldPost.action, method: .POST, form: oldPost.fields)
            #expect(legacy.status == 303 && old.cookies["__Host-sessiongate"] != nil, "\(legacy.status)")
            #expect(old.cookies["__Host-sessiongate-login-legacy"] == nil, "both pre-auth cookies are cleared")

            // Without either pre-auth cookie (a browser that dropped the cross-site cookies): refused.
            let a = TestBrowser(gatewayOrigin: h.origin)
            let (_, post) = try await a.signIn(from: "/x", as: sub, stopBeforeCallback: true)
            let binding = try #require(a.cookies["__Host-sessiongate-login"])
            a.cookies["__Host-sessiongate-login"] = nil
            a.cookies["__Host-sessiongate-login-legacy"] = nil
            let noCookie = try await a.request(post.action, method: .POST, form: post.fields)
            #expect(noCookie.status == 400 && !noCookie.headers["set-cookie"].contains { $0.hasPrefix("__Host-sessiongate=") && !$0.contains("Max-Age=0") })

            // Another browser posting this login's answer with its own pre-auth cookie: refused.
            let other = TestBrowser(gatewayOrigin: h.origin)
            _ = try await other.signIn(from: "/y", as: sub, stopBeforeCallback: true)
            let stolen = try await other.request(post.action, method: .POST, form: post.fields)
            #expect(stolen.status == 400 && other.cookies["__Host-sessiongate"] == nil)
            // That consumed the state: even the right browser cannot use it now (single use).
            a.cookies["__Host-sessiongate-login"] = binding
            #expect(try await a.request(post.action, method: .POST, form: post.fields).status == 400)

            // A fresh login completes; replaying its callback is refused and makes no session.
            let c = TestBrowser(gatewayOrigin: h.origin)
            let (ok, okPost) = try await c.signIn(from: "/x", as: sub, stopBeforeCallback: true)
            #expect(ok == nil)
            let loginCookie = try #require(c.cookies["__Host-sessiongate-login"])
            #expect(try await c.request(okPost.action, method: .POST, form: okPost.fields).status == 303)
            let replayer = TestBrowser(gatewayOrigin: h.origin)
            replayer.cookies["__Host-sessiongate-login"] = loginCookie
            let replay = try await replayer.request(okPost.action, method: .POST, form: okPost.fields)
            #expect(replay.status == 400 && replayer.cookies["__Host-sessiongate"] == nil)

            // Forged state.
            var forged = okPost.fields.filter { $0.0 != "state" }
            forged.append(("state", "forged-state"))
            replayer.cookies["__Host-sessiongate-login"] = loginCookie
            #expect(try await replayer.request(okPost.action, method: .POST, form: forged).status == 400)

            // Cancel on Apple's page → back to the sign-in page with a message.
            let d = TestBrowser(gatewayOrigin: h.origin)
            let first = try await d.request("/wanted")
            let signInPage = try await d.request(try #require(first.location))
            let href = TestBrowser.unescape(String(signInPage.body.split(separator: "\"").first { $0.hasPrefix("/_auth/login") } ?? ""))
            let authorize = try #require(try await d.request(href).location)
            let consent = TestBrowser.form(in: try await d.request(authorize).body)
            let cancelled = try await d.request(h.simulator.baseURL + consent.action, method: .POST, form: consent.fields + [("action", "cancel")])
            let answer = TestBrowser.form(in: cancelled.body)
            let back = try await d.request(answer.action, method: .POST, form: answer.fields)
            #expect(back.status == 303 && back.location == "/_auth/sign-in?message=cancelled&rd=%2Fwanted")
            let backLocation = try #require(back.location)
            #expect(try await d.request(backLocation).body.contains("Sign in was cancelled"))
            #expect(d.cookies["__Host-sessiongate"] == nil)

            // Session fixation: a cookie planted before login is replaced, and the planted id never
            // gains the victim's identity.
            let attackerSub = h.simulator.createUser()
            let attacker = TestBrowser(gatewayOrigin: h.origin)
            _ = try await attacker.signIn(from: "/x", as: attackerSub)
            let planted = try #require(attacker.cookies["__Host-sessiongate"])
            let victim = TestBrowser(gatewayOrigin: h.origin)
            victim.cookies["__Host-sessiongate"] = planted
            let victimSub = h.simulator.createUser()
            let (victimCallback, _) = try await victim.signIn(from: "/x", as: victimSub)
            #expect(victimCallback?.status == 303, "\(victimCallback?.status ?? 0) \(victimCallback?.body.prefix(300) ?? "")")
            // The planted session was valid, so the first request went through as the attacker;
            // signing in replaced it, and ended it: the attacker's own cookie is dead too.
            #expect(victim.cookies["__Host-sessiongate"] != planted)
            _ = try await victim.request("/x")
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-user"] == [victimSub])
            #expect(try await attacker.request("/x").status == 302)
        }
    }

    @Test("callback: a front-channel id_token whose c_hash names another code is refused before the code is exchanged")
    func codeHashMismatch() async throws {
        try await SignInHarness.with { h in
            let sub = h.simulator.createUser()
            h.simulator.setFaults { $0.wrongCodeHash = true }
            let a = TestBrowser(gatewayOrigin: h.origin)
            let exchanges = h.simulator.grantCount("authorization_code")
            let (_, post) = try await a.signIn(from: "/x", as: sub, stopBeforeCallback: true)
            let refused = try await a.request(post.action, method: .POST, form: post.fields)
            #expect(refused.status == 401 && refused.body.contains("identity token could not be verified"), "\(refused.status)")
            #expect(a.cookies["__Host-sessiongate"] == nil, "no session")
            #expect(h.simulator.grantCount("authorization_code") == exchanges, "the code was never sent to Apple")
            h.simulator.setFaults { $0.wrongCodeHash = false }
            let b = TestBrowser(gatewayOrigin: h.origin)
            #expect(try await b.signIn(from: "/x", as: sub).callback?.status == 303)
            #expect(try await b.request("/x").status == 200, "the real c_hash signs in")
        }
    }

    @Test("identity assertion verifies with the published keys")
    func assertion() async throws {
        try await SignInHarness.with(assertion: true) { h in
            let sub = h.simulator.createUser()
            let b = TestBrowser(gatewayOrigin: h.origin)
            _ = try await b.signIn(from: "/x", as: sub)
            #expect(try await b.request("/x").status == 200)
            let token = try #require(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-assertion"].first)
            let claims = try await Base64URLTest.verifiedClaims(token, gateway: b)
            #expect(claims["sub"] as? String == sub && claims["aud"] as? String == "app" && claims["iss"] as? String == h.origin)
            let exp = try #require((claims["exp"] as? NSNumber)?.int64Value), iat = try #require((claims["iat"] as? NSNumber)?.int64Value)
            #expect(exp - iat == 60)
        }
    }
}

@Suite("Sessions in Redis end to end", .serialized, .timeLimit(.minutes(2)))
struct RedisSessionEndToEndTests {
    @Test("store down or slow → 503 within store.timeout, cookie kept, upstream untouched; recovery without signing in again")
    func storeDown() async throws {
        // Append-only persistence: a restarted Redis still holds the session, as in production.
        let dataDirectory = NSTemporaryDirectory() + "sg-redis-\(UInt64.random(in: 0 ... .max))"
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        let process = try RedisServerProcess(arguments: ["--appendonly", "yes", "--appendfsync", "always", "--dir", dataDirectory])
        defer { try? FileManager.default.removeItem(atPath: dataDirectory) }
        // Loops of its own: on the process's shared loops another suite's work once held the
        // store.timeout timer's loop past a second, and a 1 s timeout answered in 2.1 s.
        try await withEventLoops(1) { loops in
        try await SignInHarness.with(store: .redis, redis: TestRedis(host: "127.0.0.1", port: 0, database: 0, process: process),
                                              storeTimeout: .seconds(1), localCacheTTL: .zero, loops: loops) { h in  // a second: the sign-in's writes fsync (appendfsync always) on 2 loaded cores
            let sub = h.simulator.createUser()
            let b = TestBrowser(gatewayOrigin: h.origin)
            _ = try await b.signIn(from: "/x", as: sub)
            #expect(try await b.request("/x").status == 200)
            let cookie = try #require(b.cookies["__Host-sessiongate"])
            let before = h.upstream.stats.withLockedValue { $0.requests }

            func expectUnavailable(_ what: String) async throws {
                let started = ContinuousClock.now
                let answer = try await b.request("/x")
                let elapsed = ContinuousClock.now - started
                #expect(answer.status == 503, "\(what)")
                #expect(elapsed < .seconds(2), "\(what): answered in \(elapsed)")
                #expect(answer.headers["set-cookie"].isEmpty, "\(what): the cookie is never cleared for a store error")
                #expect(try await b.request("/api/x", headers: [("accept", "application/json")]).body.contains("store_unavailable"))
            }
            func expectRecovery(_ what: String) async throws {
                var status = 0
                let deadline = ContinuousClock.now + .seconds(20)
                while status != 200, ContinuousClock.now < deadline {
                    status = try await b.request("/x").status
                    if status != 200 { try await Task.sleep(for: .milliseconds(100)) }
                }
                #expect(status == 200 && b.cookies["__Host-sessiongate"] == cookie, "\(what): the same session works again")
            }

            process.freeze()  // slow: connected, silent
            try await expectUnavailable("store slow")
            #expect(h.upstream.stats.withLockedValue { $0.requests } == before, "the upstream saw nothing")
            process.thaw()
            try await expectRecovery("after a stall")

            process.stop()  // down: connection refused
            try await expectUnavailable("store down")
            let admin = try #require(h.service.adminAddress?.port)
            func readiness() async throws -> (Int, String) {
                let r = try await b.request("http://127.0.0.1:\(admin)/readyz")
                return (r.status, r.body)
            }
            func waitForReadiness(_ body: String) async throws -> Int? {
                let deadline = ContinuousClock.now + .seconds(10)
                while ContinuousClock.now < deadline {
                    let (status, text) = try await readiness()
                    if text == body { return status }
                    try await Task.sleep(for: .milliseconds(100))  // the store is checked once a second
                }
                return nil
            }
            // Once reached, a store outage keeps the replica in rotation: public routes still work.
            #expect(try await waitForReadiness("ready; the session store is unreachable: guarded routes answer 503\n") == 200, "/readyz reports the store down")
            #expect(try await b.request("/public/x").status == 200)
            try process.start()
            try await expectRecovery("after a restart")
            #expect(try await waitForReadiness("ready\n") == 200, "/readyz recovers")
        }
        }
    }

    @Test("expired sessions (idle and absolute) are refused")
    func expiry() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .zero, idleTimeout: .seconds(3600), absoluteTimeout: .seconds(86_400)) { h in
            let b = TestBrowser(gatewayOrigin: h.origin)
            _ = try await b.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await b.request("/x").status == 200)
            let redis = try #require(h.redis)
            // Seconds for this client's commands: the whole suite shares 2 cores.
            let client = try RedisClient(configuration: .init(host: redis.host, port: redis.port, database: redis.database, commandTimeout: .seconds(3)),
                                         group: .singleton, logger: Logger(label: "t"))
            try await withTeardown(client, stop: { await $0.close() }) { client in
                let prefix = h.configuration.store.keyPrefix
                let keys = try await client.send(["KEYS", .string(prefix + "session:*")])
                guard case .array(let items?) = keys, let key = items.first?.string else { Issue.record("no session key"); return }
                let now = Int64(Date().timeIntervalSince1970 * 1000)
                _ = try await client.send(["HSET", .string(key), "last_seen", .string(String(now - 3_700_000))])
                #expect(try await b.request("/x").status == 302, "idle for longer than idle_timeout")
                _ = try await client.send(["HSET", .string(key), "last_seen", .string(String(now)), "created", .string(String(now - 90_000_000))])
                #expect(try await b.request("/x").status == 302, "older than absolute_timeout")
                _ = try await client.send(["HSET", .string(key), "created", .string(String(now - 1000))])
                #expect(try await b.request("/x").status == 200, "the same record, within both limits")
            }
        }
    }
}

/// A well-formed cookie signed with some other secret.
func Sessions_forgedCookie() throws -> String {
    var rng = SystemRandomNumberGenerator()
    let bytes = (0..<64).map { _ in UInt8.random(in: 0 ... 255, using: &rng) }
    return Base64URLTest.encode(bytes)
}

enum Base64URLTest {
    /// The claims of an ES256 JWS the gateway signed (an assertion, an event), after checking
    /// its `kid` and signature against the gateway's `/_auth/jwks.json`.
    static func verifiedClaims(_ token: String, gateway: TestBrowser) async throws -> [String: Any] {
        let jwks = try await gateway.request("/_auth/jwks.json")
        let keys = try #require((try JSONSerialization.jsonObject(with: Data(jwks.body.utf8)) as? [String: Any])?["keys"] as? [[String: Any]])
        let jwk = try #require(keys.first)
        let x = try #require(decode(jwk["x"] as? String ?? "")), y = try #require(decode(jwk["y"] as? String ?? ""))
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: x + y)
        let parts = token.split(separator: ".")
        try #require(parts.count == 3)
        let headerBytes = try #require(decode(String(parts[0])))
        let header = try #require(try JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any])
        #expect(header["alg"] as? String == "ES256" && header["kid"] as? String == jwk["kid"] as? String)
        let signatureBytes = try #require(decode(String(parts[2])))
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: signatureBytes)
        #expect(publicKey.isValidSignature(signature, for: Array("\(parts[0]).\(parts[1])".utf8)), "signed with the gateway's published key")
        let claimBytes = try #require(decode(String(parts[1])))
        return try #require(try JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any])
    }

    static func encode(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
    static func decode(_ text: String) -> [UInt8]? {
        var s = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.count % 4 != 0 { s += "=" }
        return Data(base64Encoded: s).map { Array($0) }
    }
}

enum AuthTestHTML {
    static func escape(_ s: String) -> String { s.replacingOccurrences(of: "&", with: "&amp;") }
}
